#!/usr/bin/env bash
# The GRPO measurements on one H200, one PART per call (each fits a 10-minute session; studies are resumable, so a
# call cut short is continued by running the same PART again while the machine is warm):
#   bench       rollout throughput vLLM-colocated vs HF generate, weight-sync cost and its share of a step
#               (random-weight Qwen2.5-1.5B shape)                                   -> $OUT/rollout_bench.json
#   seeds       configs/grpo/smollm2-curriculum-h200.toml x seeds 0,1,2, 3 runs sharing the GPU
#                                                                                     -> $OUT/seeds/seeds.{json,md}
#   staleness   configs/grpo/smollm2-arith-h200.toml x k in $KS (+ IS-corrected variants when IS=1)
#                                                                                     -> $OUT/staleness/staleness.*
#   hacking     configs/grpo/smollm2-arith-h200.toml, length exploit vs the gated reward -> $OUT/hacking/hacking.*
#   tests       pytest tests/grpo on the GPU machine (not the slow ones)             -> $OUT/pytest.log
# Every study folder is copied to $OUT without checkpoints (run folders: config, metrics, eval, REPORT.md), so
# `scalelab grpo docs <that folder>` can be run here afterwards.
#   usage: bash bench/gpu_grpo.sh PART [PART ...]
#   env:   MODEL     SmolLM2 weights: an HF folder or a .gguf; default: a random-weight SmolLM2 built from
#                    $SMOL_DIR/config.json (plumbing and timing only: a random model earns no reward)
#          SMOL_DIR  SmolLM2 config + tokenizer files (default .grpo-gpu/smol)
#          WHEELS    wheels the image lacks: peft, tomli_w, and gguf for a .gguf MODEL (default .grpo-gpu/whl)
#          STEPS     override train.max_steps of the studies; KS (default 0,1,2,4,8); IS=1; JOBS (runs at once)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/out}; SMOL_DIR=${SMOL_DIR:-.grpo-gpu/smol}; WHEELS=${WHEELS:-.grpo-gpu/whl}
RUNS=$PWD/runs/gpu-grpo; KS=${KS:-0,1,2,4,8}; mkdir -p "$OUT" "$RUNS"

setup() {
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      $(ls "$WHEELS"/{peft,tomli_w,gguf}-*.whl 2>/dev/null) || return 1
  [ -d /tmp/vllm-site/site ] || bash .gpu-bundle/unpack.sh > /dev/null || return 1
  export PYTHONPATH=$PWD/src:$PWD:/tmp/site:/tmp/vllm-site/site
  python3 -c "import torch, transformers, peft, vllm; print('versions', torch.__version__, transformers.__version__,
peft.__version__, vllm.__version__, torch.cuda.get_device_name(0))" || return 1
  python3 -c "import scipy, pynvml" || echo "warning: scipy (seeds study CI) or pynvml (GPU samples) missing"
}

model() {  # the SmolLM2 the studies train: $MODEL (a .gguf is dequantized once, before runs start in parallel),
           # or random weights of the same config (built once)
  if [ -n "${MODEL:-}" ]; then
    python3 -c "from scalelab.core.hfmodel import materialize; print(materialize('$MODEL'))" | tail -1; return
  fi
  python3 -c "from scalelab.grpo.randmodel import write_random_folder; import torch
print(write_random_folder('smollm2-135m', '$SMOL_DIR', '$RUNS/smollm2-random', torch.bfloat16, 'cuda'))" | tail -1
}

common() {  # --set overrides shared by the studies
  local m; m=$(model)
  echo --set "model.name=\"$m\"" --set "run.out_dir=\"$RUNS\"" ${STEPS:+--set train.max_steps=$STEPS}
}

copy_study() {  # $1 = study folder under $RUNS, $2 = name under $OUT
  mkdir -p "$OUT/$2" && tar -C "$RUNS/$1" --exclude=checkpoint.pt --exclude=rollout -cf - . | tar -C "$OUT/$2" -xf -
}

run_part() {
  local start=$(date +%s) rc=0
  case $1 in
    bench) timeout 540 python3 bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer "$SMOL_DIR" \
             --prompts 32 --group 8 --max-new-tokens 256 --out "$OUT/rollout_bench.json" || rc=$? ;;
    seeds) timeout 540 python3 -m scalelab.cli grpo seeds --config configs/grpo/smollm2-curriculum-h200.toml \
             $(common) --seeds 0,1,2 --jobs ${JOBS:-3} || rc=$?
           copy_study smollm2-curriculum seeds ;;
    staleness) timeout 540 python3 -m scalelab.cli grpo staleness --config configs/grpo/smollm2-arith-h200.toml \
             $(common) --set 'run.name="smollm2-staleness"' --k "$KS" ${IS:+--is-correction} --jobs ${JOBS:-5} || rc=$?
           copy_study smollm2-staleness staleness ;;
    hacking) timeout 540 python3 -m scalelab.cli grpo hacking --config configs/grpo/smollm2-arith-h200.toml \
             $(common) --set 'run.name="smollm2-hacking"' --jobs ${JOBS:-2} || rc=$?
           copy_study smollm2-hacking hacking ;;
    tests) timeout 540 python3 -m pytest -q -p no:cacheprovider tests/grpo -m "not slow" > "$OUT/pytest.log" 2>&1 || rc=$?
           tail -3 "$OUT/pytest.log" ;;
    *) echo "unknown part $1 (bench seeds staleness hacking tests)"; return 2 ;;
  esac
  echo "$1 exit=$rc wall=$(( $(date +%s) - start ))s"
}

setup || { echo "setup failed"; exit 1; }
for part in "$@"; do run_part "$part"; done
