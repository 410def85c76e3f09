#!/usr/bin/env bash
# Throughput and peak memory of train_gpt.py on one GPU across model sizes and micro-batches: the
# measurements `scalelab pretrain predict` is calibrated and scored on. Each config runs STEPS optimizer
# steps of one micro-batch (no accumulation), bf16 + torch.compile, on the carried ShareGPT shards.
#   usage: bash bench/gpu_pretrain_sweep.sh            (prints a table; run folders tarred into $OUT)
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; STEPS=${STEPS:-15}; DATA=${DATA:-.gpu-data/sharegpt}
# name layers heads width block micro_batch
CONFIGS=("124m-b64 12 12 768 1024 64" "350m-b32 24 16 1024 1024 32" "124m-b16 12 12 768 1024 16"
         "124m-b32 12 12 768 1024 32" "774m-b16 36 20 1280 1024 16" "124m-t2048-b16 12 12 768 2048 16")
for c in "${CONFIGS[@]}"; do
  read -r name L H D T B <<< "$c"
  start=$(date +%s)
  timeout 120 python3 src/scalelab/pretrain/train_gpt.py --config configs/pretrain/gpt2-124m-fineweb-edu.toml \
    --set "data.dir=\"$DATA\"" --set run.out_dir=\"/tmp/sweep\" --set run.name=\"$name\" --set run.gpu=\"h200\" \
    --set model.n_layer=$L --set model.n_head=$H --set model.n_embd=$D --set model.block_size=$T \
    --set train.micro_batch_size=$B --set train.total_batch_tokens=0 --set train.max_steps=$STEPS \
    --set train.val_every=0 --set train.checkpoint_every=0 --set data.val_tokens=262144 > /tmp/sweep-$name.log 2>&1
  echo "$name exit=$? wall=$(( $(date +%s) - start ))s"
  rm -f /tmp/sweep/$name/checkpoint.pt
done
tar czf $OUT/pretrain_sweep.tgz -C /tmp sweep $(cd /tmp && ls sweep-*.log) 2>/dev/null
python3 - <<'PY'
import json, pathlib
print(f"{'config':16s} {'params':>12s} {'tok/s':>10s} {'step ms':>9s} {'peak GiB':>9s}")
for p in sorted(pathlib.Path('/tmp/sweep').glob('*/train_summary.json')):
    s = json.loads(p.read_text())
    print(f"{p.parent.name:16s} {s['n_params']:12,d} {s['tokens_per_s']:10,.0f} {s['median_step_ms']:9.1f} {s['peak_memory_gib']:9.2f}")
PY
