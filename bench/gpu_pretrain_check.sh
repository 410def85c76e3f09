#!/usr/bin/env bash
# GPT-2 124M through `scalelab pretrain train` on the GPU machine: 1 GPU, then 2 GPUs with DDP and FSDP2,
# on real ShareGPT shards (carried in .gpu-data/), torch.compile + bf16. Writes each run's results.json,
# train_summary.json and metrics.jsonl into $OUT/<mode>/ (tarred) and prints one line per run.
#   usage: bash bench/gpu_pretrain_check.sh MODE [MODE ...]    MODE in: 1gpu ddp fsdp2, each optionally
#   with -blocks (compile each block and the head apart instead of the whole model)
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; STEPS=${STEPS:-20}; DATA=${DATA:-.gpu-data/sharegpt}
common=(--config configs/pretrain/gpt2-124m-fineweb-edu.toml --set "data.dir=\"$DATA\"" --set run.out_dir=\"/tmp/runs\"
        --set train.max_steps=$STEPS --set train.val_every=0 --set train.checkpoint_every=0 --set data.val_tokens=1048576
        --set run.gpu=\"h200\")
for mode in "$@"; do
  scope=model; [[ $mode == *-blocks ]] && scope=blocks
  case ${mode%-blocks} in
    1gpu)  args=(--nproc 1) ;;
    ddp)   args=(--nproc 2 --set train.parallel=\"ddp\") ;;
    fsdp2) args=(--nproc 2 --set train.parallel=\"fsdp2\") ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
  args+=(--set run.name=\"m-$mode\" --set train.compile_scope=\"$scope\")
  start=$(date +%s)
  python3 -m scalelab.cli pretrain train "${common[@]}" "${args[@]}" > /tmp/runs-$mode.log 2>&1
  echo "$mode exit=$? wall=$(( $(date +%s) - start ))s"
  tail -4 /tmp/runs-$mode.log
done
tar czf $OUT/pretrain_runs.tgz --exclude=checkpoint.pt --exclude=hf -C /tmp runs $(cd /tmp && ls runs-*.log) 2>/dev/null
for f in /tmp/runs/*/results.json; do
  python3 -c "import json,sys; r=json.load(open('$f')); print('$f', {k: r.get(k) for k in ('world_size','tokens_per_s','step_ms','peak_memory_gib','final_val_loss')}); [print('   ', c['name'], 'pred', c['predicted'], 'meas', c['measured'], 'inside', c['inside']) for c in r['comparisons']]"
done
