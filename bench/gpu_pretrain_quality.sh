#!/usr/bin/env bash
# Quality check of a faster recipe: the plain baseline and VARIANT train side by side (GPU 0 and GPU 1, same seed,
# same data order) for QSTEPS steps of 524,288 tokens and are evaluated on the same val tokens at the same token
# counts; speed that costs more than 0.02 of val loss does not count. Writes $OUT/pretrain_quality.json.
#   usage: bash bench/gpu_pretrain_quality.sh VARIANT_SETS...   e.g. 'train.fp8="all"' 'train.attention="cudnn"'
#   On one GPU: GPU_PLAIN=0 GPU_VARIANT=0 trains both at once on it (the losses do not depend on the sharing; the
#   speeds then mean nothing); SEQUENTIAL=1 trains one after the other, for a variant that does not fit beside plain
#   (B=256 takes 100 GiB). Val: the first data.val_tokens of the split for both, whatever their micro-batch.
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; QSTEPS=${QSTEPS:-120}; DATA=${DATA:-.gpu-data/sharegpt}
sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
common=(--config configs/pretrain/gpt2-124m-fineweb-edu.toml --set "data.dir=\"$DATA\"" --set run.out_dir=\"/tmp/quality\"
        --set run.gpu=\"h200\" --set train.max_steps=$QSTEPS --set train.val_every=$((QSTEPS / 4))
        --set train.checkpoint_every=0 --set schedule.warmup_steps=$((QSTEPS / 10)) --set optim.min_lr_ratio=0.1)
CUDA_VISIBLE_DEVICES=${GPU_PLAIN:-0} python3 src/scalelab/pretrain/train_gpt.py "${common[@]}" --set run.name=\"plain\" \
  > /tmp/quality-plain.log 2>&1 &
[ "${SEQUENTIAL:-0}" = 1 ] && wait
CUDA_VISIBLE_DEVICES=${GPU_VARIANT:-1} python3 src/scalelab/pretrain/train_gpt.py "${common[@]}" --set run.name=\"variant\" "${sets[@]}" \
  > /tmp/quality-variant.log 2>&1 &
wait
rm -f /tmp/quality/*/checkpoint.pt
tar czf $OUT/pretrain_quality.tgz -C /tmp quality quality-plain.log quality-variant.log 2>/dev/null
python3 - "$OUT/pretrain_quality.json" "$*" <<'PY'
import json, pathlib, sys
runs = {}
for name in ("plain", "variant"):
    rows = [json.loads(l) for l in open(f"/tmp/quality/{name}/metrics.jsonl")]
    runs[name] = {"val": {r["tokens"]: r["val_loss"] for r in rows if r["event"] == "val"},
                  "summary": json.loads(pathlib.Path(f"/tmp/quality/{name}/train_summary.json").read_text())}
print(f"variant: {sys.argv[2]}\n{'tokens':>12s} {'plain':>8s} {'variant':>8s} {'diff':>8s}")
for t, v in runs["plain"]["val"].items():
    w = runs["variant"]["val"].get(t, float("nan"))
    print(f"{t:12,d} {v:8.4f} {w:8.4f} {w - v:+8.4f}")
out = {"variant_sets": sys.argv[2], **runs,
       "final_val_diff": runs["variant"]["summary"]["final_val_loss"] - runs["plain"]["summary"]["final_val_loss"]}
pathlib.Path(sys.argv[1]).write_text(json.dumps(out, indent=2) + "\n")
PY
