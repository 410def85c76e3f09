"""Did our client and `vllm bench serve` send the same prompts? Reads two per-request record files that
bench/vllm_bench_crosscheck.py keeps with --records-dir (ours_<k>.json, vllm_bench_<tag>.json) and compares the
prompt token counts in send order: ours as the server's usage reported them, vLLM's as its loader counted them with
the served tokenizer. A prompt vLLM's loader drops (over 1,024 tokens) shifts every later one by a slot, which shows
here as a run of unequal counts. Works on any pair, the warm-up pass included, so a job cut short after its first
runs still answers it.

    python bench/crosscheck_prompts.py RECORDS_DIR [--ours ours_0.json] [--theirs vllm_bench_warmup.json] [--out F]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from scalelab.core.jsonio import read_json, write_json
from scalelab.core.provenance import collect
from vllm_bench_crosscheck import file_record, our_requests

VLLM_BENCH_PROMPT_LIMIT = 1024  # vLLM's ShareGPT loader drops longer prompts (benchmarks/datasets)


def their_prompt_tokens(record: dict, where: Path) -> list[int]:
    if "input_lens" not in record:
        raise ValueError(f"{where}: no 'input_lens' (not a `vllm bench serve` result file)")
    return [int(x) for x in record["input_lens"]]


def compare(ours: list[int], theirs: list[int]) -> dict:
    """Counts equal slot by slot, the first unequal slot, and the longest prompt of each side."""
    unequal = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    return {"n_ours": len(ours), "n_vllm_bench": len(theirs),
            "equal_in_order": min(len(ours), len(theirs)) - len(unequal),
            "first_unequal_slot": unequal[0] if unequal else None,
            "same_prompts": not unequal and len(ours) == len(theirs),
            "max_prompt_tokens": {"ours": max(ours, default=0), "vllm_bench": max(theirs, default=0)},
            "over_vllm_bench_limit": sum(x > VLLM_BENCH_PROMPT_LIMIT for x in ours)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records_dir", type=Path)
    ap.add_argument("--ours", default="ours_0.json")
    ap.add_argument("--theirs", default="vllm_bench_warmup.json")
    ap.add_argument("--out", default="", help="write the comparison here (JSON) as well as printing it")
    args = ap.parse_args(argv)
    ours_p, theirs_p = args.records_dir / args.ours, args.records_dir / args.theirs
    ours = [int(r["prompt_tokens"]) for r in our_requests(ours_p)]
    out = {**compare(ours, their_prompt_tokens(read_json(theirs_p), theirs_p)),
           "provenance": collect({"records": {p.name: file_record(p) for p in (ours_p, theirs_p)}})}
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
