#!/usr/bin/env bash
# LoRA-DPO throughput on one H200: TRL's defaults against our recipe (bench/dpo_throughput.py). The one command on
# the GPU machine:
#   bash bench/gpu_dpo_throughput.sh [WHEEL_DIR] [bench options ...]    WHEEL_DIR default .dpo-gpu/whl (carry it)
# Without --model: the Qwen2.5-7B shape, random bf16 weights, synthetic pairs, seq 2048 -> dpo_throughput_qwen7b.json.
# Real weights and pairs, medians over alternating repeats (the model's local folder or registry cache must be
# on the machine; nothing is downloaded):
#   bash bench/gpu_dpo_throughput.sh .dpo-gpu/whl --model qwen2.5-coder-1.5b-instruct-q4km \
#       --pairs /tmp/dpo-runs/gsm8k/preferences.jsonl --repeats 2 [--out $OUT/NAME.json]
# The results file is --out when given, else $OUT/dpo_throughput_<model name or folder name>.json.
# The image has torch, transformers, peft, pyarrow, pandas and xxhash; the wheels bring trl, datasets, dill,
# multiprocess and tomli_w (a pyarrow wheel in the folder is skipped). Writes the results file and
# $OUT/dpo_throughput.log; exits 1 when the equal-loss check fails.
set -uo pipefail
WHL=${1:-.dpo-gpu/whl}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
# packed micro-batches change shape every step: expandable segments keep the allocator from fragmenting
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# the results file: --out as given, else named after --model (a real model's results must not read as qwen7b)
model="" results=""
args=("${@:2}")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --model) model=${args[i + 1]:-} ;;
    --model=*) model=${args[i]#--model=} ;;
    --out) results=${args[i + 1]:-} ;;
    --out=*) results=${args[i]#--out=} ;;
  esac
done
if [[ -z $results ]]; then
  if [[ -n $model ]]; then
    name=$(basename "${model%/}")
    results=$OUT/dpo_throughput_${name//[^A-Za-z0-9._-]/_}.json
  else
    results=$OUT/dpo_throughput_qwen7b.json
  fi
  args+=(--out "$results")
fi
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
echo "results: $results"
python3 bench/dpo_throughput.py "${args[@]}" 2>&1 | tee "$OUT/dpo_throughput.log"
