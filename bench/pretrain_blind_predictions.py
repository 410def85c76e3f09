#!/usr/bin/env python
"""Blind predictions of GPT-2 sizes never trained here (774M, 1.5B), written and committed before their runs.

    python bench/pretrain_blind_predictions.py --data .gpu-data/sharegpt     # -> results/h200/pretrain/blind-sizes/
    python bench/pretrain_blind_predictions.py --data .gpu-data/sharegpt --gpu h100-sxm   # -> results/h100/...

Each size is configured as the scaling ladder trains (bench/gpu_scaling_ladder.sh: B=16 x T=1024, lr 6e-4 x 768/d,
10% warmup, cosine to 10%, the ladder's data and val tokens) at the ladder's 512-step budget (8,388,608 tokens),
with torch.compile on, so tokens/s and peak memory come from the calibrated throughput and memory models, and the
final val loss from the ladder's L(N, D) fit. Interval widths are fixed here, before any run: the calibration's own
(largest held-out error of the throughput fit; the memory fit's) and, for the loss, the largest error of the ladder
law refitted without its largest N or largest D (pretrain/ladder_check.py), wider than the fit's residual scatter.
The runs that score them: the command in the file, on one GPU of the kind named (--gpu), then a later commit
compares. On an H100 the throughput calibration is the H200's transferred (same compute die: the same utilization and
per-step overhead, the loss term at the H100's HBM bandwidth; pretrain.calibrate.for_hardware), so those predictions
also test that transfer; loss and memory do not depend on which of the two runs them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scalelab.core.jsonio import read_json, write_json
from scalelab.core.provenance import git_sha
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.ladder_check import check_ladder
from scalelab.pretrain.params import law_params
from scalelab.pretrain.predict import LADDER_PATH, predict, prediction_to_dict

REPO = Path(__file__).resolve().parents[1]
GPUS = {"h200": "h200", "h100-sxm": "h100"}   # hardware key -> results/<folder>/pretrain/blind-sizes
BASE = "configs/pretrain/gpt2-124m-fineweb-edu.toml"
SIZES = {"774M": (36, 20, 1280), "1.5B": (48, 25, 1600)}   # GPT-2 medium-large / XL shapes (Radford et al. 2019)
STEPS = 512


def ladder_sets(layers: int, heads: int, width: int, data: str, gpu: str) -> list[str]:
    """The --set list bench/gpu_scaling_ladder.sh gives a run of this shape, with compile on and the GPU named."""
    return [f'data.dir="{data}"', f'run.gpu="{gpu}"', f"model.n_layer={layers}", f"model.n_head={heads}",
            f"model.n_embd={width}", "train.micro_batch_size=16", "train.total_batch_tokens=0",
            f"train.max_steps={STEPS}", f"schedule.warmup_steps={STEPS // 10}", f"optim.lr={6e-4 * 768 / width:.3g}",
            "optim.min_lr_ratio=0.1", "train.val_every=0", "train.checkpoint_every=100", "data.val_tokens=1048576",
            "train.compile=true"]


def blind(name: str, shape: tuple[int, int, int], data: str, loss_interval: float, gpu: str) -> dict:
    sets = ladder_sets(*shape, data, gpu)
    cfg = load_pretrain_config(str(REPO / BASE), sets)
    pred = prediction_to_dict(predict(cfg, 1, gpu))
    loss = pred["loss"]["final_loss"]
    return {"size": name, "shape": dict(zip(("n_layer", "n_head", "n_embd"), shape)), "sets": sets,
            "n_params_law": law_params(cfg.model), "prediction": pred,
            "loss_held_out_interval": [loss * (1 - loss_interval), loss * (1 + loss_interval)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the ladder's prepared shards (manifest sha256 4cff727114d9...)")
    ap.add_argument("--gpu", default="h200", choices=sorted(GPUS), help="the hardware the runs will use")
    ap.add_argument("--out", help="default results/<h200|h100>/pretrain/blind-sizes")
    args = ap.parse_args(argv)
    out = args.out or f"results/{GPUS[args.gpu]}/pretrain/blind-sizes"
    ladder = read_json(LADDER_PATH)
    check = check_ladder(ladder["points"], {})
    rows = [blind(name, shape, args.data, check["prediction_interval"], args.gpu) for name, shape in SIZES.items()]
    sizes_env = ",".join(" ".join(map(str, s)) for s in SIZES.values())
    gpu_flag = "" if args.gpu == "h200" else f" --gpu {args.gpu}"
    gpu_set = "" if args.gpu == "h200" else f' run.gpu=\\"{args.gpu}\\"'
    write_json(REPO / out / "predictions.json", {
        "schema": "scalelab.blind_predictions/1", "written_unix": time.time(), "git_sha": git_sha(REPO),
        "command": "python bench/pretrain_blind_predictions.py --data " + args.data + gpu_flag,
        "ladder": {"points": len(ladder["points"]), "data_manifest_sha256": ladder["data_manifest_sha256"],
                   "held_out": [{"split": h["split"], "max_abs_error": h["max_abs_error"]} for h in check["held_out"]],
                   "loss_interval": check["prediction_interval"]},
        "run_command": (f'LADDER=/tmp/blind.json ROOT=/tmp/blind DATA=/tmp/d SIZES_ENV="{sizes_env}" '
                        f'STEPS_ENV={STEPS} EXTRA_SETS="train.compile=true{gpu_set}" bash bench/gpu_scaling_ladder.sh'),
        "sizes": rows})
    for r in rows:
        p = r["prediction"]
        print(f"{r['size']}: {p['n_params']:,} params; tokens/s {p['throughput']['tokens_per_s']:,.0f}; "
              f"peak {p['memory']['total_bytes'] / 2**30:.1f} GiB; val loss {p['loss']['final_loss']:.3f} "
              f"({r['loss_held_out_interval'][0]:.3f}-{r['loss_held_out_interval'][1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
