#!/usr/bin/env bash
# GRPO of the real Qwen2.5-Coder-0.5B-Instruct on GSM8K on one H200 (configs/grpo/qwen2.5-coder-0.5b-gsm8k-h200.toml,
# one run per learning rate side by side), the shipped recipe's collapse beside its defense (the format reward
# gated by correctness), the staleness ablation, the update's speed alone, and the base model's battery; each
# recipe run's policy is then exported and scored on MATH-500 (out of domain) through a vLLM server. One window of
# WORK_S seconds on a warm machine:
#   bash bench/gpu_grpo_real.sh prep [CHUNK_DIR]     here: the chunk set (the GGUF, the wheels the image lacks, the
#                                                    GSM8K and MATH-500 data) in chunks (default /tmp/grpo-chunks)
#   bash bench/gpu_grpo_real.sh bundle               unpack the vLLM bundle (carry .gpu-bundle)
#   bash bench/gpu_grpo_real.sh setup CHUNK_DIR      join the carried chunk set (bench/TRANSFER.md: the GGUF as
#                                                    model.gguf, whl/ with the wheels the image lacks, data.tar.xz
#                                                    with the evaluation sets), install, dequantize the model
#   bash bench/gpu_grpo_real.sh restore TGZ          unpack an earlier window's runs.tgz into $RUNS: its finished
#                                                    runs (results.json, eval/summary.json) are skipped, e.g. the
#                                                    staleness study's first window's variants in its second
#   bash bench/gpu_grpo_real.sh launch               start `work` in a session of its own (it outlives the call)
#   bash bench/gpu_grpo_real.sh poll SECONDS         wait up to SECONDS (or until work ends), results to $OUT/runs.tgz
#   bash bench/gpu_grpo_real.sh part NAME...          run parts in the foreground of this call, results as poll's
# Every part resumes (run checkpoints, per-task battery records), so `work` run again continues a cut-off window.
#   env: OUT (default /tmp/out), RUNS (default /tmp/grpo-runs), TREE (the copy of the tree `launch` runs from,
#        default /tmp/tree-grpo: bench/snapshot.sh), WORK_S (default 1140), SEED (default 0),
#        SEEDS (the recipe runs' seeds, one run each, default SEED),
#        LRS (default "2e-5 5e-5"), TEMPS (rollout temperatures, one run per LRS x TEMPS; default the
#        recipe's), UB_VARIANTS (the update bench's),
#        PARTS (default "battery recipe collapse", side by side; also "staleness"; PARTS="" none),
#        SOLO_PARTS (run first, alone, e.g. "update_bench update_profile rollout_bench"), STAGGER_S (seconds
#        between the starts of side-by-side parts and recipe runs, default 5),
#        RB_CASES (the rollout bench's cases, default
#        "real-colocated real-colocated-sub real-standalone fixed1024-colocated fixed1024-standalone k1 k2 k4"),
#        RB_S (seconds per case, default 420), RB_K_EXTRA and RB_K_TAG (more flags for the k cases, a suffix for
#        their names),
#        STALE_STEPS, STALE_JOBS (default 40, and one run per 32 GiB of GPU memory, at most 3: a recipe run peaks at
#        ~30 GB, its engine's 0.15 share included, so an H100 takes 2 and an H200 3), STALE_COMPILE (default false),
#        STALE_K0, STALE_IS0, STALE_K1 (the k lists of seeds 0 and 1; STALE_K1="" skips seed 1),
#        AFTER_TASKS (the exported policies' battery, default math500: GSM8K is the run's own final evaluation),
#        RECIPE_SETS (more `--set K=V` arguments for the recipe runs, e.g. "--set data.oversample=1.5"), RUN_TAG
#        (a word in those runs' names for that variant, e.g. "os1.5": recipe-lr5e-5-os1.5-s0),
#        BATTERY_TASKS (the base battery's tasks, default all), with prep's BATTERY_WHEELS and BATTERY_DATA for
#        its multiple-choice part (e.g. BATTERY_TASKS=arc_easy,arc_challenge,piqa BATTERY_DATA=llmfoundry_icl and
#        lm_eval's wheels as in bench/gpu_dpo_real.sh),
#        SCALELAB_GIT_SHA (the commit, as the copied tree has no .git)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false \
       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export SCALELAB_CACHE=/tmp/scalelab-cache SCALELAB_SHARED_DATA=/tmp/data
export PYTHONPATH=$PWD/src:/tmp/site:/tmp/vllm-site/site
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/grpo-runs}; WORK_S=${WORK_S:-1140}; SEED=${SEED:-0}
LRS=${LRS:-"2e-5 5e-5"}; PARTS=${PARTS-"battery recipe collapse"}  # set but empty: no side-by-side part
LOGS=$RUNS/logs
NAME=qwen2.5-coder-0.5b-instruct-q4km
GGUF_REL=gguf/$NAME/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
RECIPE=configs/grpo/qwen2.5-coder-0.5b-gsm8k-h200.toml
SHIPPED=configs/grpo/qwen2.5-7b-gsm8k.toml
mkdir -p "$OUT" "$RUNS" "$LOGS"
sl() { python3 -m scalelab.cli "$@"; }
END=$((SECONDS + WORK_S))  # every launch of this call stops by then: its train.budget_s is what is left
left() { echo $((END - SECONDS - ${1:-0})); }
grpo() {  # $1 = log name, then `grpo train` arguments: runs when >= 150 s are left, stopping at the call's end
  local log=$1; shift
  [ "$(left)" -ge 150 ] || { echo "skipped: $(left) s left in this call" >> "$LOGS/$log.log"; return 0; }
  timeout -s INT "$(left -30)" python3 -m scalelab.cli grpo train "$@" --set train.budget_s=$(left 80) \
    >> "$LOGS/$log.log" 2>&1
}

WHEELS="gguf==0.19.0 tomli_w==1.2.0"   # what `models path` (dequantize) and the run folders' config.toml need
prep() {  # here: one chunk set; the battery's multiple-choice tasks need lm_eval's wheels besides (BATTERY_WHEELS)
  local chunks=${1:-/tmp/grpo-chunks} src=/tmp/grpo-carry-src py=${PY:-python3}
  rm -rf "$src" "$chunks" && mkdir -p "$src/whl" || return 1
  cp "$(PYTHONPATH=src "$py" -m scalelab.cli models path "$NAME" --gguf)" "$src/model.gguf" || return 1
  # for the image's Python 3.12 (multiprocess ships one wheel per Python version)
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$src/whl" $WHEELS ${BATTERY_WHEELS:-} || return 1
  local smol
  smol=$(PYTHONPATH=src "$py" -m scalelab.cli models path smollm2-135m-instruct | tail -1) || return 1
  mkdir -p "$src/smol-tokenizer" && cp "$smol"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,config.json} \
    "$src/smol-tokenizer/" || return 1
  # ${BATTERY_DATA}: the battery's multiple-choice sets when it runs here, e.g. "llmfoundry_icl" for ARC-e/ARC-c/PIQA
  tar -C ../shared/data -cJf "$src/data.tar.xz" README.md gsm8k math500 ${BATTERY_DATA:-} || return 1
  tar -C "$src" -cJf "$src/smol-tokenizer.tar.xz" smol-tokenizer && rm -r "$src/smol-tokenizer" || return 1
  PYTHONPATH=src "$py" -m scalelab.core.chunks split "$src" "$chunks" --max-mib 46
}

setup() {  # $1 = the folder holding the chunk set's manifest and chunks
  local t0=$SECONDS
  python3 -m scalelab.core.chunks join /tmp/carry "$1" || return 1
  rm -rf "$1"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/carry/whl/*.whl || return 1
  mkdir -p /tmp/data && tar -C /tmp/data -xJf /tmp/carry/data.tar.xz || return 1
  tar -C /tmp -xJf /tmp/carry/smol-tokenizer.tar.xz || return 1  # the 1,024-sequence rollout case's tokenizer
  mkdir -p "$SCALELAB_CACHE/$(dirname "$GGUF_REL")" && mv /tmp/carry/model.gguf "$SCALELAB_CACHE/$GGUF_REL"
  echo "setup: joined and installed in $((SECONDS - t0)) s"
  sl models path "$NAME" || return 1  # checks the GGUF's pinned sha256, dequantizes once into the cache
  echo "setup: model ready after $((SECONDS - t0)) s"
  python3 -c "import torch, transformers, peft, vllm; print('versions torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__, 'vllm', vllm.__version__,
torch.cuda.get_device_name())"
}

recipe_run() {  # $1 = learning rate, $2 = sampling temperature (empty: the recipe's), $3 = seed: train until 330 s
  # before the end, then score it in and out of domain
  local name=recipe-lr$1${2:+-t$2}${RUN_TAG:+-$RUN_TAG}-s$3  # RUN_TAG names a RECIPE_SETS variant, e.g. os1.5
  END=$((END - ${RESERVE_S:-330})) grpo "$name" --config "$RECIPE" --set run.out_dir="\"$RUNS\"" \
    --set run.name="\"$name\"" --set optim.lr=$1 ${2:+--set rollout.temperature=$2} --set train.seed=$3 \
    ${RECIPE_SETS:+$RECIPE_SETS}
  sl grpo eval "$RUNS/$name" >> "$LOGS/$name.log" 2>&1  # a run stopped by its budget is scored at that step
  sl grpo export "$RUNS/$name" "/tmp/exports/$name" >> "$LOGS/$name.log" 2>&1 || return 1
  timeout -s INT "$(left)" python3 -m scalelab.cli evals battery --model "/tmp/exports/$name" \
    --out "$RUNS/$name/battery" --data-dir /tmp/data --tasks ${AFTER_TASKS:-math500} --reference-model "$NAME" \
    --engine-flag gpu-memory-utilization=0.1 >> "$LOGS/$name.log" 2>&1
}

recipe() {  # one run per learning rate, temperature (TEMPS) and seed (SEEDS), side by side on the GPU (vLLM engines
  # start one at a time: a lock)
  local lr temp seed pids=()
  for lr in $LRS; do
    for temp in ${TEMPS:--}; do  # "-": the recipe's own temperature
      for seed in ${SEEDS:-$SEED}; do
        recipe_run "$lr" "${temp#-}" "$seed" & pids+=($!); sleep "${STAGGER_S:-5}"
      done
    done
  done
  wait "${pids[@]}"
}

collapse() {  # the shipped recipe on the real model (as a new user ran it), then the same with the format gated
  # 0.12: at 0.08, started beside three running engines, vLLM found "No available memory for the cache blocks"
  local common=(--config "$SHIPPED" --set model.name="\"$NAME\"" --set rollout.engine='"vllm_colocated"'
                --set model.lora.enabled=false --set rollout.server.gpu_memory_utilization=0.12
                --set optim.micro_batch_size=8 --set train.max_steps=10 --set train.checkpoint_every=5
                --set rollout.server.tensor_parallel=1 --set rollout.server.gpus="\"\"" --set train.seed=$SEED
                --set run.out_dir="\"$RUNS\"")
  grpo collapse-shipped "${common[@]}" --set run.name='"collapse-shipped"'
  grpo collapse-gated "${common[@]}" --set run.name='"collapse-gated"' \
    --set 'data.rewards=["correctness", "format_gated"]'
}

UB_METRICS=results/h200/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-lr1e-4-s0/metrics.jsonl  # the update benches' batch
ub() {  # $1 = log name, then bench/grpo_update_bench.py's arguments: alone on the GPU, at most UB_S seconds
  local log=$1; shift
  mkdir -p "$RUNS/update-bench"
  timeout -s INT "${UB_S:-240}" python3 bench/grpo_update_bench.py --metrics "$UB_METRICS" "$@" >> "$LOGS/$log.log" 2>&1
}

update_bench() {  # the update alone on the GPU beside the measured matmul rate (SOLO_PARTS: before the rest)
  ub update_bench --out "$RUNS/update-bench/update_bench.json" --reps 3 \
    --variants "${UB_VARIANTS:-budget-chunked-eager,budget-chunked,budget-chunked-layers}"
}

update_profile() {  # where the update's time goes: one budget-chunked pass under torch.profiler, alone on the GPU
  ub update_profile --variants budget-chunked --reps 1 --out "$RUNS/update-bench/update_profile.json" \
    --profile "$RUNS/update-bench/update_profile.txt"
}

rollout_bench() {  # item 3's rollout ratios, alone on the GPU: the real model on GSM8K prompts (its own answer
  # lengths) at the recipe's memory share, colocated vs HF, then the standalone vllm.LLM.generate ceiling in a
  # process of its own; the 1,024 fixed-length case (random 1.5B shape) with a cProfile of one vLLM call, both
  # engines, then colocated over 2 and 4 vLLM engines
  local d=$RUNS/rollout-bench
  mkdir -p "$d"
  rb() { local name=$1; shift; echo "== $name" >> "$LOGS/rollout_bench.log"
         # RB_S per case: on a fresh machine vLLM's compile alone ran past 110 s (cases cut at 170 s lost everything)
         timeout -s INT "${RB_S:-420}" python3 bench/grpo_rollout_bench.py "$@" --out "$d/$name.json" \
           >> "$LOGS/rollout_bench.log" 2>&1; }
  local real=(--model "$NAME" --task gsm8k --prompts 64 --group 8 --max-new-tokens 512 --hf-logprobs none
              --gpu-memory-utilization 0.15 --repeats 2)
  local fixed=(--model random:qwen2.5-1.5b --tokenizer /tmp/smol-tokenizer --prompts 64 --group 16
               --max-new-tokens 256 --cudagraph-max 1024 --repeats 2 --no-update --no-sync --trace-steps)
  # RB_CASES picks cases (default all, in this order) when a window has room for only some
  local all="real-colocated real-colocated-sub real-standalone fixed1024-colocated fixed1024-standalone k1 k2 k4"
  local cases=" ${RB_CASES:-$all} "
  want() { [[ $cases == *" $1 "* ]]; }
  want real-colocated && rb real-colocated "${real[@]}" --lora-rank 32
  # the same with vLLM's engine core in a child process (weights synced over CUDA IPC): is the in-process engine
  # core's Python, sharing the model runner's thread, what keeps the colocated engine under the standalone one?
  want real-colocated-sub && rb real-colocated-sub "${real[@]}" --lora-rank 32 --engine-core subprocess
  # the standalone engine as a user runs it: vLLM's default engine core in a child process
  want real-standalone && VLLM_ENABLE_V1_MULTIPROCESSING=1 rb real-standalone "${real[@]}" \
    --engines hf,vllm_standalone --no-update --no-sync
  want fixed1024-colocated && rb fixed1024-colocated "${fixed[@]}" --profile "$d/fixed1024-colocated.prof.txt"
  want fixed1024-standalone && VLLM_ENABLE_V1_MULTIPROCESSING=1 rb fixed1024-standalone "${fixed[@]}" \
    --engines hf,vllm_standalone --profile "$d/fixed1024-standalone.prof.txt"
  # the same batch over K colocated engines, each scheduling its 1/K of the prompts in a process of its own; CUDA
  # graphs up to each engine's 1,024 / K sequences, as the K = 1 run's go up to its whole batch. K = 1 with its
  # engine core in a child process too, so K is the only change between the three. RB_K_EXTRA: more flags for
  # these cases (e.g. "--switch-interval-ms 0.5"), named with the suffix RB_K_TAG (e.g. "-si0.5"). Each engine
  # after the first starts in another 33-50 s on an H100 (its engine core's process start-up and imports, then its
  # memory profile, one engine at a time), so a case gets 60 s more per engine beyond the first
  local k
  for k in 1 2 4; do
    want "k$k" || continue
    RB_S=$(( ${RB_S:-420} + 60 * (k - 1) )) rb "fixed1024-colocated-k$k${RB_K_TAG:-}" "${fixed[@]}" \
      --cudagraph-max $((1024 / k)) --engine-core subprocess --vllm-engines "$k" ${RB_K_EXTRA:-}
  done
  python3 bench/rollout_bench_table.py "$d" --out "$RUNS/rollout-bench-table.md" >> "$LOGS/rollout_bench.log" 2>&1
}

stale_jobs() {  # runs side by side: one per 32 GiB of the GPU's memory, 1 to 3
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  local n=$(( ${mib:-0} / 32768 )); [ "$n" -ge 1 ] || n=1; [ "$n" -le 3 ] || n=3; echo "$n"
}

staleness() {  # k = 0,1,2,4,8 at seed 0 with the IS correction at k = 4 and 8, then k = 0 and 4 at seed 1: 40 steps
  # of 32 x 8 each, STALE_JOBS at once; held-out: 500 problems at the end and every 10 steps. Resumable: a finished
  # variant is skipped, a cut one continues from its last checkpoint (every 5 steps).
  local common=(--config "$RECIPE" --set run.out_dir="\"$RUNS\"" --set train.max_steps=${STALE_STEPS:-40}
                --set train.budget_s=0 --set train.checkpoint_every=5 --set eval.limit=500 --set eval.every=10
                --set eval.curve_limit=500 --set optim.compile_layers=${STALE_COMPILE:-false}
                --jobs "${STALE_JOBS:-$(stale_jobs)}")  # compiled layers save ~0.5 s a step and cost ~60 s: not at 40 steps
  [ "$(left)" -ge "${STALE_MIN_S:-420}" ] || { echo "staleness skipped: $(left) s left" >> "$LOGS/staleness-s0.log"
                                               return 0; }  # a run cut before its end would be lost with the disk
  local is0=${STALE_IS0-4,8}  # set and empty: no corrected variants in this window
  timeout -s TERM "$(left)" python3 -m scalelab.cli grpo staleness "${common[@]}" --set run.name='"staleness-s0"' \
    --k "${STALE_K0:-0,1,2,4,8}" ${is0:+--is-k "$is0"} >> "$LOGS/staleness-s0.log" 2>&1
  [ -n "${STALE_K1-0,4}" ] || return 0  # STALE_K1="": this window runs seed 0's subset only
  timeout -s TERM "$(left)" python3 -m scalelab.cli grpo staleness "${common[@]}" --set run.name='"staleness-s1"' \
    --set train.seed=1 --k "${STALE_K1:-0,4}" >> "$LOGS/staleness-s1.log" 2>&1
}

battery() {  # the base model's battery (resumable per task): multiple choice through lm-eval, then generation
  timeout -s INT "$(left)" python3 -m scalelab.cli evals battery --model "$NAME" --out "$RUNS/battery-$NAME" \
    --data-dir /tmp/data ${BATTERY_TASKS:+--tasks $BATTERY_TASKS} --engine-flag gpu-memory-utilization=0.1 \
    --lm-eval-batch-size 8 >> "$LOGS/battery.log" 2>&1
}

pack() {  # every run folder without weights or engine files, as one archive: a call brings back only so many files
  tar -czf "$OUT/runs.tgz.tmp" -C "$RUNS" --exclude='checkpoint*' --exclude=weights --exclude='*.safetensors' \
    --exclude='*.pt' --exclude=rollout . && mv "$OUT/runs.tgz.tmp" "$OUT/runs.tgz"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
}

work() {
  local part pids=()
  for part in ${SOLO_PARTS:-}; do "$part"; done  # alone on the GPU, one after another
  for part in $PARTS; do "$part" & pids+=($!); sleep "${STAGGER_S:-5}"; done  # starts staggered, as recipe()
  wait "${pids[@]}"
  echo "work done after $SECONDS s" > "$RUNS/work.done"
}

poll() {  # $1 = seconds to wait at most; packs every 120 s too, so a call cut by the device's time limit still
  # brings back what was done by then
  local until=$((SECONDS + $1)) packed=$SECONDS
  while [ $SECONDS -lt "$until" ] && [ ! -f "$RUNS/work.done" ]; do
    sleep 10
    [ $((SECONDS - packed)) -lt 120 ] || { pack; packed=$SECONDS; }
  done
  pack
  for f in "$LOGS"/*.log; do echo "== $(basename "$f")"; grep -E "^step|held-out|budget|rror|wrote|gsm8k|math500" "$f" \
    | tail -3 | cut -c1-220; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  cat "$RUNS/work.done" 2>/dev/null || echo "work still running"
}

case "${1:-}" in
  prep) prep "${2:-}" ;;
  bundle) bash .gpu-bundle/unpack.sh | tail -1 ;;
  setup) setup "${2:?usage: bash bench/gpu_grpo_real.sh setup CHUNK_DIR}" ;;
  restore) tar -xzf "${2:?usage: bash bench/gpu_grpo_real.sh restore RUNS_TGZ}" -C "$RUNS" && rm -f "$RUNS/work.done" \
           && echo "restored into $RUNS: $(ls "$RUNS" | tr '\n' ' ')" ;;
  launch) rm -f "$RUNS/work.done"; cd "$(bash bench/snapshot.sh "${TREE:-/tmp/tree-grpo}")" || exit 1
          setsid nohup bash "$0" work > "$RUNS/work.log" 2>&1 < /dev/null &
          sleep 2; echo "launched work (pid $!), window ${WORK_S} s" ;;
  work) work ;;
  part) shift; for p in "$@"; do "$p"; done; pack ;;  # named parts now, in this call (e.g. update_bench: no model)
  poll) poll "${2:?usage: bash bench/gpu_grpo_real.sh poll SECONDS}" ;;
  *) echo "usage: bash bench/gpu_grpo_real.sh prep [CHUNK_DIR] | bundle | setup CHUNK_DIR | restore TGZ | launch | work |" \
          "part NAME... | poll SECONDS" >&2; exit 2 ;;
esac
