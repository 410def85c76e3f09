"""The rollout ratios of a set of bench/grpo_rollout_bench.py runs as one markdown table: each run's engines beside
the HF baseline measured in the same process, and, for a colocated run with a standalone run of the same batch
(same model, task, prompts x group, max_new_tokens, memory share), the colocated engine's share of the standalone
ceiling. K is the run's number of vLLM engines (--vllm-engines: colocated vllm.LLM instances sharing the GPU;
runs recorded before the option ran one). Ratios across two processes compare two HF baselines as well: their
ratio is printed, so a drift between the processes shows. Runs traced with --trace-steps get a second table: where
each engine's front-end steps went in the last timed call (or, for a case cut by its time limit, the call in flight
from its .partial.json): blocked on the engine core's output, processing it, or outside step().

    python bench/rollout_bench_table.py RUN_DIR [--out table.md]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def batch_key(r: dict) -> tuple:
    """What makes two runs the same batch on the same engine budget."""
    b, o = r["batch"], (r.get("vllm_options") or {}).get("requested") or {}
    return (r["model"]["name"], r.get("task", "arithmetic"), b["prompts"], b["group_size"], b["max_new_tokens"],
            b["temperature"], b["top_p"], o.get("gpu_memory_utilization"))


def engine_count(r: dict, vllm: str | None) -> int | None:
    """vLLM engines the run used: its vllm_engines record, else 1 (runs written before the option); None for HF."""
    return None if vllm is None else int(r.get("vllm_engines") or 1)


def row(name: str, r: dict) -> dict:
    e = r["engines"]
    vllm = next((k for k in ("vllm_colocated", "vllm_standalone") if k in e), None)
    a = r["answer_lengths"]
    return {"run": name, "engine": vllm, "k": engine_count(r, vllm), "sequences": r["batch"]["sequences"],
            "hf": e["hf"]["tokens_per_s"], "vllm": e[vllm]["tokens_per_s"] if vllm else None,
            "ratio": r["ratio_vllm_over_hf"],
            "mean_len": a["mean"], "p90_len": a["p90"], "at_cap": a["at_cap_frac"], "key": batch_key(r)}


def ceiling_shares(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """run -> (colocated / standalone tokens/s, the two runs' HF baselines' ratio) for each matched pair."""
    out = {}
    for c in rows:
        if c["engine"] != "vllm_colocated":
            continue
        for s in rows:
            if s["engine"] == "vllm_standalone" and s["key"] == c["key"]:
                out[c["run"]] = (c["vllm"] / s["vllm"], c["hf"] / s["hf"])
    return out


def render(runs: dict[str, dict]) -> str:
    rows = [row(name, r) for name, r in sorted(runs.items())]
    shares = ceiling_shares(rows)
    lines = ["| run | vLLM engine | K | sequences | answer tokens mean / p90 (at cap) | HF tok/s | vLLM tok/s "
             "| vLLM / HF | colocated / standalone (HF drift) |",
             "|---|---|---:|---:|---|---:|---:|---:|---|"]
    for x in rows:
        share = shares.get(x["run"])
        vllm = f"{x['vllm']:,.0f}" if x["vllm"] else "-"
        ratio = f"{x['ratio']:.2f}x" if x["ratio"] else "-"
        lines.append(f"| {x['run']} | {x['engine'] or '-'} | {x['k'] or '-'} | {x['sequences']:,} | "
                     f"{x['mean_len']:.0f} / {x['p90_len']:.0f} ({100 * x['at_cap']:.1f}%) | {x['hf']:,.0f} | "
                     f"{vllm} | {ratio} | "
                     + (f"{100 * share[0]:.0f}% ({share[1]:.2f})" if share else "-") + " |")
    return "\n".join(lines) + "\n"


def trace_call(record: dict) -> tuple[str, dict] | None:
    """(which call, its step record) from a run's step_trace: the last finished call, else the one in flight."""
    t = record.get("step_trace") or {}
    calls = t.get("calls") or []
    if calls:
        timed = len(calls) - 1  # the first call is the warm-up
        return (f"timed {timed} of {timed}" if timed else "warm-up"), calls[-1]
    if t.get("in_flight"):
        return f"cut after {t['in_flight']['elapsed_s']:.0f} s ({len(calls)} done)", t["in_flight"]
    return None


def trace_table(records: dict[str, dict]) -> str:
    """Per traced run: steps and their split, as shares of each engine's span averaged over the engines."""
    lines = ["| run | call | engines | steps per engine | mean step (ms) | blocked on engine core | front end "
             "processing | outside step() | outputs/s, all engines |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, record in sorted(records.items()):
        found = trace_call(record)
        if found is None:
            continue
        label, call = found
        engines = [e for e in call["engines"] if e["steps"] and e["span_s"] > 0]
        if not engines:
            lines.append(f"| {name} | {label} | {len(call['engines'])} | 0 | - | - | - | - | - |")
            continue
        share = lambda key: sum(e[key] / e["span_s"] for e in engines) / len(engines)  # noqa: E731
        steps = sum(e["steps"] for e in engines) / len(engines)
        step_ms = sum(e["mean_step_ms"] for e in engines) / len(engines)
        lines.append(f"| {name} | {label} | {len(call['engines'])} | {steps:,.0f} | {step_ms:.1f} | "
                     f"{100 * share('wait_s'):.0f}% | {100 * share('process_s'):.0f}% | "
                     f"{100 * share('outside_s'):.0f}% | {sum(e['outputs_per_s'] for e in engines):,.0f} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    runs, cut = {}, {}
    for f in sorted(args.run_dir.glob("*.json")):
        try:
            record = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise SystemExit(f"{f}: not JSON ({e})") from None
        if f.name.endswith(".partial.json"):  # a cut case: no throughput row, its steps in flight if traced
            cut[f.name.removesuffix(".partial.json") + " (cut)"] = record
        elif isinstance(record, dict) and "engines" in record:  # not e.g. the folder's provenance.json
            runs[f.stem] = record
    text = render(runs) if runs else ""
    steps = trace_table({**runs, **cut})
    text += ("\n" if text and steps else "") + steps
    if not text:
        raise SystemExit(f"{args.run_dir}: no rollout bench .json files (nor a traced cut case)")
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
