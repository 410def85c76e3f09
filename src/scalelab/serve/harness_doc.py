"""The serve page's check of its own client: bench/vllm_bench_crosscheck.py's results (our client against `vllm bench
serve` on one server, the same prompts, load and seed, interleaved repeats), one table per file.

    harness_md(files) -> list[str]     files: (path, the name the page prints); a file not there is named as such

Each table puts the medians over repeats side by side, their ratio, and vLLM's own per-request records run through
our metric code against vLLM's printed figures: a ratio of 1 there means the two define the metric the same way, so
any gap left between the clients is measurement, not definition. Where the file carries it, each repeat's p50 TTFT
per client follows, and the request-by-request pairing (`paired_ttft`: our TTFT minus vLLM's for the same prompt
in the same repeat), which tells a client that measures differently (one sign in every repeat) from a server
whose timing varies from run to run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from scalelab.core.jsonio import is_stored, read_json

HEADING = "## Is the client right? Against `vllm bench serve`"
LABELS = {"output_tokens_per_s": "output tok/s", "ttft_p50_ms": "p50 TTFT (ms)", "ttft_p99_ms": "p99 TTFT (ms)",
          "itl_p50_ms": "p50 ITL (ms)", "itl_p99_ms": "p99 ITL (ms)"}


def _where(d: dict) -> str:
    prov = d.get("provenance", {})
    hw = prov.get("hardware", {})
    gpus = hw.get("gpus") or []
    machine = f"{len(gpus)} x {gpus[0]}" if gpus else f"a {hw.get('cpu_count', '?')}-core CPU"
    return f"{machine}, vLLM {prov.get('vllm_version') or '(version not recorded)'}"


def _load(c: dict) -> str:
    rate = c.get("rate")
    if rate is not None and math.isfinite(rate):
        return f"Poisson {rate:g} req/s"
    return f"closed loop, {c.get('concurrency')} in flight"


def _verdict(d: dict, key: str) -> str:
    goal = d.get("within_goal", {}).get(key)
    tol, spread = d.get("within_tolerance", {}).get(key), d.get("within_spread", {}).get(key)
    parts = [f"within {d.get('goal_ratio_tolerance', 0):.0%}: {'yes' if tol else 'no'}" if tol is not None else "",
             f"within the repeat range: {'yes' if spread else 'no'}" if spread is not None else ""]
    said = "; ".join(p for p in parts if p)
    return f"{'met' if goal else 'not met'}" + (f" ({said})" if said else "")


def _table(d: dict) -> list[str]:
    med: dict[str, Any] = d["median_over_repeats"]
    ratios = d["ratios_of_medians"]
    lines = ["| metric | ours | vllm bench | ours / vllm bench | vLLM's records, our code / vllm bench | goal |",
             "|---|---|---|---|---|---|"]
    for key in med["ours"]:
        lines.append(f"| {LABELS.get(key, key)} | {med['ours'][key]:,.2f} | {med['vllm_bench'][key]:,.2f} | "
                     f"{ratios['ours/vllm_bench'][key]:.3f} | "
                     f"{ratios['vllm_raw_ours_metrics/vllm_bench'][key]:.3f} | {_verdict(d, key)} |")
    return lines


def _by_repeat(d: dict, key: str = "ttft_p50_ms") -> str:
    rows = {(r["client"], r["repeat"]): r[key] for r in d.get("rows", [])}
    reps = sorted({k for _, k in rows})
    pairs = [f"{rows[('ours', k)]:.1f} / {rows[('vllm_bench', k)]:.1f}" for k in reps
             if ("ours", k) in rows and ("vllm_bench", k) in rows]
    return f"{LABELS[key]} by repeat, ours / vllm bench: " + ", ".join(pairs) + "." if pairs else ""


def _paired(d: dict) -> list[str]:
    p = d.get("paired_ttft")
    if not p:
        return []
    lines = ["| repeat | prompts paired (unpaired) | TTFT ours - vLLM, median (ms) | mean (ms) | 10th / 90th pct (ms) "
             "| ours longer |", "|---|---|---|---|---|---|"]
    for r in p["repeats"]:
        lo, hi = r["ttft_diff_ms_p10_p90"]
        lines.append(f"| {r['repeat']} | {r['pairs']} ({r.get('unpaired', 0)}) | {r['ttft_diff_ms_median']:+.1f} | "
                     f"{r['ttft_diff_ms_mean']:+.1f} | {lo:+.1f} / {hi:+.1f} | {r['share_ours_longer']:.0%} |")
    sign = "the same sign in every repeat" if p["one_sign_in_every_repeat"] else "no common sign across repeats"
    return ["Request by request (the same prompt in one repeat's two runs): " + sign + ".", "", *lines, ""]


def harness_md(files: Sequence[tuple[Path, str]]) -> list[str]:
    if not files:
        return []
    lines = [HEADING, "",
             "Every latency on this page comes from our own streaming client. It was checked against vLLM's "
             "benchmark client on the same server: the same prompts, load and seed, the two clients' repeats "
             "interleaved; medians over repeats. The goal: medians within the tolerance and within the "
             "repeat-to-repeat range.", ""]
    for path, shown in files:
        if not is_stored(path):
            lines += [f"- `{shown}`: not measured yet (no such file).", ""]
            continue
        d = read_json(path)
        c = d["config"]
        lines += [f"`{shown}`: {_where(d)}; {_load(c)}, {c.get('num_prompts')} prompts, {c.get('repeats')} "
                  f"repeats per client, {c.get('output_tokens')} output tokens each.", "", *_table(d), ""]
        rep = _by_repeat(d)
        lines += ([rep, ""] if rep else []) + _paired(d)
    return lines
