"""The rollout ratios of a set of bench/grpo_rollout_bench.py runs as one markdown table: each run's engines beside
the HF baseline measured in the same process, and, for a colocated run with a standalone run of the same batch
(same model, task, prompts x group, max_new_tokens, memory share), the colocated engine's share of the standalone
ceiling. K is the run's number of vLLM engines (--vllm-engines: colocated vllm.LLM instances sharing the GPU;
runs recorded before the option ran one). Ratios across two processes compare two HF baselines as well: their
ratio is printed, so a drift between the processes shows.

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    runs = {}
    for f in sorted(args.run_dir.glob("*.json")):
        if f.name.endswith(".partial.json"):  # a cut case's baseline alone: no row to make of it
            continue
        try:
            record = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise SystemExit(f"{f}: not JSON ({e})") from None
        if isinstance(record, dict) and "engines" in record:  # not e.g. the folder's provenance.json
            runs[f.stem] = record
    if not runs:
        raise SystemExit(f"{args.run_dir}: no rollout bench .json files")
    text = render(runs)
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
