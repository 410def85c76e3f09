#!/usr/bin/env bash
# Time to target loss on one H200: (a) the plain AdamW baseline (configs/pretrain/gpt2-124m-fineweb-edu.toml:
# lr 6e-4, 524,288 tokens/step, bf16, torch.compile) trains for TOKENS tokens; its final val loss is the target.
# (b) the recipe (RECIPE_SETS: Muon + the fastest measured options) trains on the same data order, schedule and
# budget, evaluated at the same steps, and stops at the first evaluation at or below the target
# (train.target_val_loss). Both evaluate every VAL_EVERY steps on the same val tokens. The goal: the recipe's
# training seconds to the target <= 0.6 x the baseline's for the whole budget. Writes $OUT/pretrain_time_to_target.json
# (both curves, val loss vs tokens and vs training seconds, the ratio, provenance and the exact trainer commands).
#
# Data: the carried ShareGPT shards (26.9M train tokens). TOKENS defaults to 200 steps = 104,857,600 tokens, ~3.9
# epochs: Muennighoff et al. 2023 ("Scaling data-constrained language models") find up to ~4 epochs of repeated
# data worth nearly as much as fresh data, so the budget stays in the regime where more steps still help.
# Time (estimated): the baseline 200 x 1.08 s of steps (measured plain step) + compile (~1.5 min, and a recompile
# for eval mode) + 40 evals of ~1 s + 4 checkpoints: ~6-7 min; the recipe less, as it stops at the target. So two
# calls: the recipe starts only with MIN_LEFT_S left, else on the next call.
#
# Built for 10-minute calls: it stops starting work when BUDGET_S is spent; a run cut off keeps its last checkpoint
# (every CKPT_EVERY steps) and resumes on the next call while the machine is warm. A finished run's curve is kept in
# RESULT (results/h200/pretrain/ttt/results.json): copy $OUT/pretrain_time_to_target.json there after each call so
# that a fresh machine skips a finished baseline. Repeat until it prints "complete".
#   usage (device, data carried):  bash bench/gpu_pretrain_ttt.sh
#   another recipe:                RECIPE_SETS='train.optimizer="muon" optim.muon_lr=0.03' bash ...
#   the recipe's schedule length (warmup and decay end within it; it still stops at the target; default 0.6 x
#   TOKENS, the goal's budget):    RECIPE_TOKENS=104857600 bash bench/gpu_pretrain_ttt.sh    (200 steps)
#   a recipe with its own batch (tokens per optimizer step; its steps = RECIPE_TOKENS / this):
#                                  RECIPE_TOKENS_PER_STEP=262144 RECIPE_TOKENS=62914560 bash ...   (240 steps)
#   toy run on a CPU: tests/pretrain/test_ttt.py (EXTRA_SETS='train.device="cpu" ...', TOKENS_PER_STEP=64)
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; DATA=${DATA:-.gpu-data/sharegpt}; TOKENS=${TOKENS:-104857600}; VAL_EVERY=${VAL_EVERY:-5}
BUDGET_S=${BUDGET_S:-560}; CKPT_EVERY=${CKPT_EVERY:-50}; ROOT=${ROOT:-runs/ttt}
MIN_LEFT_S=${MIN_LEFT_S:-240}   # do not start a run with less: compile (~1.5 min) + CKPT_EVERY steps must fit
RESULT=${RESULT:-results/h200/pretrain/ttt/results.json}
CONFIG=${CONFIG:-configs/pretrain/gpt2-124m-fineweb-edu.toml}
BASE_SETS=${BASE_SETS:-}
# the measured recipe (results/h200/pretrain/ttt/results.json): Muon on the hidden matrices, 3x llm.c's AdamW lr
# for the rest, cuDNN attention and the chunked loss (the two fastest exact options, results/h200/pretrain/variants-round2)
RECIPE_SETS=${RECIPE_SETS:-'train.optimizer="muon" train.attention="cudnn" train.loss_chunks=8 optim.lr=1.8e-3'}
RECIPE_TOKENS=${RECIPE_TOKENS:-$(( TOKENS * 6 / 10 ))}   # its schedule ends at the goal: 0.6 x TOKENS (120 steps)
TOKENS_PER_STEP=${TOKENS_PER_STEP:-524288}   # the baseline's train.total_batch_tokens (the config's 0.5M)
RECIPE_TOKENS_PER_STEP=${RECIPE_TOKENS_PER_STEP:-$TOKENS_PER_STEP}   # the recipe's; default: the same batch
STEPS=$(( TOKENS / TOKENS_PER_STEP ))
RECIPE_STEPS=$(( RECIPE_TOKENS / RECIPE_TOKENS_PER_STEP ))  # the recipe's schedule length
mkdir -p "$OUT" "$ROOT"
start=$(date +%s); todo=0
common=(--config "$CONFIG" --set "data.dir=\"$DATA\"" --set "run.out_dir=\"$ROOT\"" --set 'run.gpu="h200"'
        --set train.max_steps=$STEPS --set train.val_every=$VAL_EVERY --set train.checkpoint_every=$CKPT_EVERY
        --set schedule.warmup_steps=$(( STEPS / 10 )))   # warmup 10% of the run, as gpu_pretrain_quality.sh
key=$(python3 -c 'import json,sys; print(json.dumps(dict(zip(["tokens","recipe_tokens","val_every","data","config",
"base_sets","recipe_sets","extra_sets","tokens_per_step","recipe_tokens_per_step"], sys.argv[1:]))))' "$TOKENS" \
  "$RECIPE_TOKENS" "$VAL_EVERY" "$DATA" "$CONFIG" "$BASE_SETS" "$RECIPE_SETS" "${EXTRA_SETS:-}" \
  "$TOKENS_PER_STEP" "$RECIPE_TOKENS_PER_STEP")   # runs and results of other settings are never mixed
ttt() { python3 bench/gpu_pretrain_ttt.py "$1" --root "$ROOT" --result "$RESULT" --key "$key" "${@:2}"; }
ttt check || exit 2   # a results file of other settings is never mixed in
if [ -f "$ROOT/settings.json" ] && [ "$(cat "$ROOT/settings.json")" != "$key" ]; then
  echo "$ROOT holds runs made with other settings ($(cat "$ROOT/settings.json")); remove it or set ROOT="; exit 2
fi
echo "$key" > "$ROOT/settings.json"

run() {  # name "k=v k=v": train (or resume) one run in the time left; returns 0 once it has finished
  local name=$1 left rc
  local args=("${common[@]}" --set "run.name=\"$name\"")
  for kv in $2 ${EXTRA_SETS:-}; do args+=(--set "$kv"); done   # EXTRA_SETS last: they win
  ttt finished --name "$name" && { echo "== $name: finished"; return 0; }
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  if (( left < MIN_LEFT_S )); then echo "== $name: only $left s left; call again"; todo=1; return 1; fi
  printf '%q ' python3 -m scalelab.cli pretrain train "${args[@]}" > "$ROOT/$name.cmd"  # exact, re-runnable
  echo "== $name ($left s left): $(cat "$ROOT/$name.cmd")"
  timeout "$left" python3 -m scalelab.cli pretrain train "${args[@]}" >> "$ROOT/$name.log" 2>&1
  rc=$?
  tail -2 "$ROOT/$name.log"
  ttt finished --name "$name" && return 0
  echo "== $name: exit $rc (124 = cut off by the budget; resumes from its checkpoint on the next call)"
  todo=1; return 1
}

if run baseline "train.total_batch_tokens=$TOKENS_PER_STEP $BASE_SETS"; then
  target=$(ttt target)
  echo "== target val loss (baseline, $TOKENS tokens): $target"
  run recipe "train.total_batch_tokens=$RECIPE_TOKENS_PER_STEP train.max_steps=$RECIPE_STEPS schedule.warmup_steps=$(( RECIPE_STEPS / 10 )) $RECIPE_SETS \
train.target_val_loss=$target"
fi
commands=()
for n in baseline recipe; do [ -f "$ROOT/$n.cmd" ] && commands+=(--command "$n=$(cat "$ROOT/$n.cmd")"); done
ttt report --out "$OUT/pretrain_time_to_target.json" "${commands[@]}"
tar czf "$OUT/pretrain_ttt_runs.tgz" --exclude=checkpoint.pt -C "$ROOT" . 2>/dev/null
(( todo )) && echo "not complete: call again to continue" || echo "complete"
