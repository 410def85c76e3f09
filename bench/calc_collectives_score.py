#!/usr/bin/env python
"""calc's collective-time terms scored on the committed NCCL measurements, point by point. No GPU needed.

    python bench/calc_collectives_score.py            # writes results/h200/calc/collectives-scored/, prints Markdown

Each (collective, size) of the 2-GPU sweep is predicted by the hardware-table link (fitted on nothing),
by calc's alpha-beta fit with that point left out, and by one link fitted on the other collectives
(calc/collective_score.py says why these three). The file also bounds the communication a 124M DDP step
can expose: its fp32 gradient all-reduced in DDP's 25 MB buckets with nothing overlapped, against the
step residual (2-GPU step - 1-GPU step / 2) that bench/calc_vs_measured.py calls "measured comm".
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from scalelab.calc.calibration import fits_from_results
from scalelab.calc.collective_score import (Scored, Summary, bucketed_all_reduce_s, points_from_bench, score_cross,
                                            score_loo, score_prior, summarize)
from scalelab.calc.collectives import Link
from scalelab.calc.docs_measured import collectives_lines
from scalelab.calc.modelconfig import load_model_file
from scalelab.calc.models import count_params
from scalelab.core.hardware import get_hardware
from scalelab.core.jsonio import read_json, write_json
from scalelab.core.provenance import git_sha

REPO = Path(__file__).resolve().parents[1]
NCCL = "results/h200/nccl_collectives.json"
CVM = "results/h200/calc_vs_measured.json"           # the DDP step residual it derived from the step files
OUT = "results/h200/calc/collectives-scored"
DDP_CASE = "ddp-s1"
PRETRAIN = "configs/pretrain/gpt2-124m-fineweb-edu.toml"  # the config every 124M run used
DDP_BUCKET_BYTES = 25 * 2**20                        # torch DDP's bucket_cap_mb default


def score(doc: dict, gpu: str = "h200") -> tuple[list[Scored], list[Summary]]:
    n, points = points_from_bench(doc)
    hw = get_hardware(gpu)
    prior = Link(hw.link_gb_s * 1e9, hw.link_latency_us * 1e-6, hw.source)
    rows = score_prior(points, n, prior) + score_loo(points, n) + score_cross(points, n)
    return rows, summarize(rows)


def ddp_bound(doc: dict, cvm: dict) -> dict:
    """All of a 124M step's gradient all-reduces at the fitted rate, against the step residual."""
    n = int(doc["world_size"])
    fit = fits_from_results(doc, NCCL)["all_reduce"]
    grad_bytes = 4 * count_params(load_model_file(REPO / PRETRAIN)[0]).total    # fp32 gradients under autocast
    total = bucketed_all_reduce_s(grad_bytes, DDP_BUCKET_BYTES, n, Link(fit.busbw_bytes_s, fit.alpha_s))
    case = next(c for c in cvm["cases"] if c["key"] == DDP_CASE)
    return {"grad_bytes": grad_bytes, "bucket_bytes": DDP_BUCKET_BYTES,
            "all_reduce_total_s": total, "step_residual_s": case["measured_comm_s"],
            "residual_not_communication_s": case["measured_comm_s"] - total,
            "residual_definition": case["measured_comm_definition"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nccl", default=NCCL)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    doc = read_json(REPO / args.nccl)
    rows, summaries = score(doc)
    bound = ddp_bound(doc, read_json(REPO / CVM))
    out = REPO / args.out
    write_json(out / "results.json", {
        "schema": "scalelab.collectives_scored/1", "measured": args.nccl, "world_size": doc["world_size"],
        "summary": [asdict(s) for s in summaries],
        "rows": [{**asdict(r), "rel_err": r.rel_err, "regime": r.regime} for r in rows], "ddp_bound": bound})
    write_json(out / "provenance.json", {"git_sha": git_sha(REPO), "command": "python bench/calc_collectives_score.py",
                                         "inputs": [args.nccl, CVM], "measured_provenance": doc.get("provenance", {})})
    print("\n".join(collectives_lines(read_json(out / "results.json"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
