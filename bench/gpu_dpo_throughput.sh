#!/usr/bin/env bash
# LoRA-DPO throughput on one H200: TRL's defaults against our recipe (bench/dpo_throughput.py), Qwen2.5-7B shape,
# random bf16 weights, seq 2048. The one command on the GPU machine:
#   bash bench/gpu_dpo_throughput.sh [WHEEL_DIR] [bench options ...]    WHEEL_DIR default .dpo-gpu/whl (carry it)
# The image has torch, transformers, peft, pyarrow, pandas and xxhash; the wheels bring trl, datasets, dill,
# multiprocess and tomli_w (a pyarrow wheel in the folder is skipped). Writes $OUT/dpo_throughput_qwen7b.json
# and $OUT/dpo_throughput.log; exits 1 when the equal-loss check fails.
set -uo pipefail
WHL=${1:-.dpo-gpu/whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
# packed micro-batches change shape every step: expandable segments keep the allocator from fragmenting
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
wheels=()
for w in "$WHL"/*.whl; do
  [[ $(basename "$w") == pyarrow* ]] || wheels+=("$w")
done
[[ ${#wheels[@]} -gt 0 && -e ${wheels[0]} ]] || { echo "no wheels in $WHL"; exit 2; }
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}" || exit 1
export PYTHONPATH=$PWD/src:$SITE
if [[ -z ${SCALELAB_GIT_SHA:-} ]]; then
  SCALELAB_GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  export SCALELAB_GIT_SHA
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 bench/dpo_throughput.py --out "$OUT/dpo_throughput_qwen7b.json" "${@:2}" 2>&1 | tee "$OUT/dpo_throughput.log"
