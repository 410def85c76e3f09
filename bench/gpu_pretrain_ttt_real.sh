#!/usr/bin/env bash
# Time to target by the speedrun's rules on one H200 (issue 27, item 1), in resumable 10-minute calls:
#   1. the AdamW baseline's lr grid (GRID_LRS, >= 4 values, seed GRID_SEED), each one pass over the train tokens;
#      while the best lr sits at either end the grid is extended there by its own step (ttt_stats.grid_rule),
#      up to MAX_GRID lrs;
#   2. SEEDS baseline seeds at the tuned lr, one pass each; target = the mean of their final val losses;
#   3. SEEDS recipe seeds (RECIPE_SETS), at most one pass each, each stopping at its first evaluation at or below
#      the target (train.target_val_loss).
# One pass = the steps a seeded shuffle (train.seed) serves before its second epoch, so no window is seen twice by
# either side: floor(micro-batches of the epoch / grad accum), where each train shard gives floor(its windows of
# block_size+1 tokens / (micro_batch_size * world)) micro-batches (`gpu_pretrain_ttt_real.py steps`, which says what
# is left out); floor(train tokens / TOKENS_PER_STEP) can overshoot it. TOKENS_PER_STEP <= 131,072 so that a pass is
# >= 200 steps (the prepared corpus: 30,638,617 train tokens in shards of 30,000,000 and 638,617 = 233 steps at
# B=64, T=1024; 1,216,711 val tokens). RECIPE_SETS change the optimizer and kernels, not B or T, so a pass is the
# same length for both sides.
# Held-out check: each finished run's WikiText-2 loss (`scalelab pretrain heldout`, from its checkpoint while this
# machine still has it) goes to heldout.json in its run folder and beside its val loss in stats.json ("losses").
# HELDOUT = the shard folder of configs/pretrain/prepare-wikitext2-heldout.toml, prepared here when missing and
# ../shared/data is there, else carried (.gpu-data/wikitext2-heldout); without it the runs are trained, not scored.
# Every run evaluates every VAL_EVERY steps on the whole val split of the manifest (a fixed val set, as the
# speedrun's); the clock excludes compile warm-up and evaluation (bench/gpu_pretrain_ttt.py).
#
# Data: configs/pretrain/prepare-sharegpt-corpora.toml, moved as .gpu-data/z/sharegpt-corpora.tar.xz
# (bash bench/gpu_data.sh pack sharegpt-corpora; carry ".gpu-data/z"). The held-out set, 0.5 MB: scalelab pretrain
# prepare --config configs/pretrain/prepare-wikitext2-heldout.toml --set 'out_dir=".gpu-data/wikitext2-heldout"'
# (carry ".gpu-data/wikitext2-heldout" too, unless the machine has ../shared/data).
# Run folders (no checkpoints) go to RESULTS = results/h200/pretrain/ttt/{grid/lr-*,baseline/seed-*,recipe/seed-*}
# and a copy to $OUT/ttt/; after each call copy $OUT/ttt/* into results/h200/pretrain/ttt/ and commit, so that a
# fresh machine skips what is finished. A run cut off by the call's end resumes from its checkpoint while the
# machine is warm, else starts again (~3 min: 233 steps at the plain 496k tokens/s measured on one H200, 0.26 s each,
# plus compile and evaluations).
# Repeat until it prints "complete"; the statistics are in RESULTS/stats.json.
#   usage (device):  bash bench/gpu_data.sh unpack /tmp/d && DATA=/tmp/d bash bench/gpu_pretrain_ttt_real.sh
#   toy run on CPU:  tests/pretrain/test_ttt_real.py
set -uo pipefail
export PYTHONPATH=$PWD/src:/tmp/site:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; DATA=${DATA:-/tmp/d}; RESULTS=${RESULTS:-results/h200/pretrain/ttt}; ROOT=${ROOT:-runs/ttt-real}
CONFIG=${CONFIG:-configs/pretrain/gpt2-124m-fineweb-edu.toml}
HELDOUT=${HELDOUT:-.gpu-data/wikitext2-heldout}; HELDOUT_NAME=${HELDOUT_NAME:-wikitext2}
TOKENS_PER_STEP=${TOKENS_PER_STEP:-131072}; VAL_EVERY=${VAL_EVERY:-10}; CKPT_EVERY=${CKPT_EVERY:-50}
GRID_LRS=${GRID_LRS:-"3e-4 6e-4 1.2e-3 2.4e-3"}   # 2x steps around GPT-3's 6e-4 for 125M (Table 2.1)
GRID_SEED=${GRID_SEED:-0}; SEEDS=${SEEDS:-5}; MAX_GRID=${MAX_GRID:-8}
BUDGET_S=${BUDGET_S:-560}; MIN_LEFT_S=${MIN_LEFT_S:-240}   # compile (~1.5 min) + a pass (~1 min) must fit
# the measured recipe of bench/gpu_pretrain_ttt.sh: Muon on the hidden matrices, cuDNN attention, the chunked loss
RECIPE_SETS=${RECIPE_SETS:-'train.optimizer="muon" train.attention="cudnn" train.loss_chunks=8 optim.lr=1.8e-3'}
if (( TOKENS_PER_STEP > 131072 )); then echo "TOKENS_PER_STEP=$TOKENS_PER_STEP: the issue's bound is 131,072" >&2; exit 2; fi
pass_sets=(--set "data.dir=\"$DATA\"" --set train.total_batch_tokens=$TOKENS_PER_STEP)
for kv in ${EXTRA_SETS:-}; do pass_sets+=(--set "$kv"); done
STEPS=$(python3 bench/gpu_pretrain_ttt_real.py steps --results "$RESULTS" --config "$CONFIG" "${pass_sets[@]}") || exit 2
mkdir -p "$OUT/ttt" "$ROOT" "$RESULTS"
if [ ! -e "$HELDOUT" ] && [ -d ../shared/data/corpora/wikitext2_tokenized ]; then
  python3 -m scalelab.cli pretrain prepare --config configs/pretrain/prepare-wikitext2-heldout.toml \
    --set "out_dir=\"$HELDOUT\"" --set progress=false > /dev/null || echo "== could not prepare $HELDOUT"
fi
start=$(date +%s); todo=0
common=(--config "$CONFIG" --set "data.dir=\"$DATA\"" --set "run.out_dir=\"$ROOT\"" --set 'run.gpu="h200"'
        --set data.val_tokens=0 --set train.max_steps=$STEPS --set train.total_batch_tokens=$TOKENS_PER_STEP
        --set train.val_every=$VAL_EVERY --set train.checkpoint_every=$CKPT_EVERY
        --set schedule.warmup_steps=$(( STEPS / 10 )) --set optim.min_lr_ratio=0.0)   # warmup 10%, cosine to 0
ana() { python3 bench/gpu_pretrain_ttt_real.py "$@" --results "$RESULTS" --seeds "$SEEDS"; }

keep() {  # run folder -> RESULTS/<layout> and $OUT/ttt/<layout>, without the checkpoint
  local src=$1 layout=$2
  for dest in "$RESULTS/$layout" "$OUT/ttt/$layout"; do
    mkdir -p "$dest" && find "$src" -maxdepth 1 -type f ! -name 'checkpoint*' -exec cp {} "$dest/" \;
  done
}

heldout() {  # layout: a finished run's loss on the held-out set, scored once from its checkpoint, kept beside it
  local layout=$1 name=${1//\//-}
  ana scored --dir "$RESULTS/$layout" --name "$HELDOUT_NAME" && return 0
  [ -e "$HELDOUT" ] || { echo "== $layout: no held-out set $HELDOUT, $HELDOUT_NAME not scored"; return 0; }
  [ -f "$ROOT/$name/checkpoint.pt" ] || { echo "== $layout: no checkpoint here, $HELDOUT_NAME not scored"; return 0; }
  if timeout 120 python3 -m scalelab.cli pretrain heldout "$ROOT/$name" --data "$HELDOUT" --name "$HELDOUT_NAME" \
       >> "$ROOT/$name/heldout.log" 2>&1; then
    keep "$ROOT/$name" "$layout"; tail -1 "$ROOT/$name/heldout.log"
  else
    echo "== $layout: scoring $HELDOUT_NAME failed"; tail -3 "$ROOT/$name/heldout.log"
  fi
}

run() {  # layout "k=v k=v": train (or resume) one run in the time left; returns 0 once it has finished
  local layout=$1 name=${1//\//-} left rc
  local args=("${common[@]}" --set "run.name=\"$name\"")
  for kv in $2 ${EXTRA_SETS:-}; do args+=(--set "$kv"); done   # EXTRA_SETS last: they win
  ana finished --dir "$RESULTS/$layout" && { echo "== $layout: finished"; heldout "$layout"; return 0; }
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  if (( left < MIN_LEFT_S )); then echo "== $layout: only $left s left; call again"; todo=1; return 1; fi
  mkdir -p "$ROOT/$name"
  printf '%q ' python3 -m scalelab.cli pretrain train "${args[@]}" > "$ROOT/$name/cmd"   # exact, re-runnable
  echo "== $layout ($left s left)"
  timeout "$left" python3 -m scalelab.cli pretrain train "${args[@]}" >> "$ROOT/$name/train.log" 2>&1
  rc=$?
  keep "$ROOT/$name" "$layout"
  ana finished --dir "$RESULTS/$layout" && { heldout "$layout"; return 0; }
  echo "== $layout: exit $rc (124 = cut off by the call's end)"; tail -3 "$ROOT/$name/train.log"
  todo=1; return 1
}

tune() {  # the grid, extended while its best lr is at an end; sets tuned_lr
  local lrs=($GRID_LRS) verdict lr
  while :; do
    for lr in "${lrs[@]}"; do run "grid/lr-$lr" "optim.lr=$lr train.seed=$GRID_SEED" || return 1; done
    verdict=$(ana grid); echo "== grid: $verdict"
    case $verdict in
      tuned*) tuned_lr=${verdict#tuned }; return 0 ;;
      extend*) (( ${#lrs[@]} >= MAX_GRID )) && { echo "grid of $MAX_GRID lrs still not tuned"; return 1; }
               lrs+=("${verdict##* }") ;;
      *) return 1 ;;
    esac
  done
}

if tune; then
  ok=1
  for s in $(seq 1 "$SEEDS"); do run "baseline/seed-$s" "optim.lr=$tuned_lr train.seed=$s" || ok=0; done
  if (( ok )) && target=$(ana target); then
    echo "== target val loss (mean of $SEEDS baseline seeds after one pass): $target"
    for s in $(seq 1 "$SEEDS"); do
      run "recipe/seed-$s" "$RECIPE_SETS train.seed=$s train.target_val_loss=$target" || true
    done
  fi
fi
ana stats && cp "$RESULTS/stats.json" "$OUT/ttt/stats.json"
(( todo )) && echo "not complete: call again to continue" || echo "complete"
