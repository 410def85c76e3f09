"""The serve page's check of its own client: bench/vllm_bench_crosscheck.py's results (our client against `vllm bench
serve` on one server, the same prompts, load and seed, interleaved repeats), one table per file.

    harness_md(files) -> list[str]     files: (path, the name the page prints); a file not there is named as such

Each table puts the medians over repeats side by side, their ratio, and vLLM's own per-request records run through
our metric code against vLLM's printed figures: a ratio of 1 there means the two define the metric the same way, so
any gap left between the clients is measurement, not definition.
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
    return lines
