"""How much a val loss moved with the micro-batch before shards.ValWindows: the trainer read the val split in
strides of B*T*world and scored floor(budget / (B*T*world)) of them, so runs at different B were scored on
different prefixes of the split. This prices that difference with the one model that needs no GPU, the train
unigram (prepare.unigram_cross_entropy, add-one smoothed), on each prefix the old rule scored. No GPU needed.

    PYTHONPATH=src python bench/val_subset_shift.py --data .gpu-data/sharegpt --val-tokens 10485760 --batch 64 128 256
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from scalelab.pretrain.prepare import UNIGRAM_COUNTS_FILE, unigram_cross_entropy
from scalelab.pretrain.shards import ValWindows, list_shards


def stride_prefix_tokens(split_tokens: int, budget: int, batch: int, seq: int, world: int = 1) -> int:
    """Target tokens the old rule scored: whole B*T*world strides of min(budget, split) tokens."""
    stride = batch * seq * world
    return min(budget or split_tokens, split_tokens) // stride * stride


def shifts(data: Path, budget: int, batches: list[int], seq: int) -> dict:
    targets = ValWindows(list_shards(data, "val"), seq).targets()  # the whole split, in window order
    counts = np.load(data / UNIGRAM_COUNTS_FILE)
    split = len(targets)
    rows = {b: stride_prefix_tokens(split, budget, b, seq) for b in batches}
    ce = {b: unigram_cross_entropy(counts, targets[:n]) for b, n in rows.items()}
    base = batches[0]
    return {"split_tokens": split, "budget": budget, "seq": seq, "baseline_batch": base,
            "rows": {str(b): {"tokens_scored": rows[b], "unigram_ce": ce[b], "shift_vs_baseline": ce[b] - ce[base]}
                     for b in batches}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--val-tokens", type=int, default=10_485_760)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256], help="the first is the baseline")
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args(argv)
    out = shifts(args.data, args.val_tokens, args.batch, args.seq)
    for b, r in out["rows"].items():
        print(f"B={b:>4s}: {r['tokens_scored']:>10,} tokens  unigram {r['unigram_ce']:.4f}  "
              f"shift {r['shift_vs_baseline']:+.4f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
