#!/usr/bin/env bash
# The scaling-law ladder: GPT-2-family models of 4 sizes x 4 token budgets on the carried ShareGPT shards, each run
# trained to its own budget with its own cosine schedule (Hoffmann et al. 2022 fit one schedule length per point),
# final val loss on the same first 1,048,576 val tokens. The finished runs' losses go to
# results/h200/pretrain/scaling-ladder/results.json (also copied to $OUT), which `scalelab pretrain predict` then fits
# L(N, D) = E + A/N^alpha + B/D^beta on for runs on the same data (same manifest sha256).
#
# Built for 10-minute calls: it stops starting runs when BUDGET_S is spent, does not start a fresh run whose predicted
# time (its steps at the calibration's low tokens/s, plus START_S of start-up) exceeds what is left (the next call
# starts it whole, where a cut one would need this machine to stay warm), a run cut off by the budget keeps its
# last checkpoint (every 100 steps, written atomically) and resumes on the next call while the machine is warm, and
# runs already in results/h200/pretrain/scaling-ladder/results.json are skipped, so a fresh machine continues where the file ends.
# Copy $OUT/scaling_ladder.json to results/h200/pretrain/scaling-ladder/results.json after each call.
#   usage (device, data carried):  bash bench/gpu_scaling_ladder.sh        (carry .gpu-data; repeat until "complete")
#   smoke test on a CPU: LADDER=/tmp/l.json ROOT=/tmp/ladder SIZES_ENV="2 2 32" STEPS_ENV="4 8" \
#     EXTRA_SETS='train.device="cpu" train.compile=false train.dtype="float32" model.block_size=64' bash ...
# Per run: B=16 x T=1024 = 16,384 tokens/step, below Kaplan et al. 2020's critical batch at these losses
# (B_crit = 2e8 / L^(1/0.21) tokens: ~60k at L = 5.5), so each token is spent efficiently; peak lr 6e-4 x 768/d
# (GPT-3 Table 2.1's 6e-4 at d = 768, scaled as 1/width for Adam as in muP, Yang et al. 2022), warmup 10% of steps,
# cosine to 10% of peak (GPT-3 appendix B). Eager mode: at <= 2,048 steps a compile per run costs more than it saves,
# and it leaves the loss as it is (all 16 runs: ~16 minutes of H200 time).
set -uo pipefail
export PYTHONPATH=$PWD/src:/tmp/site:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; DATA=${DATA:-.gpu-data/sharegpt}; BUDGET_S=${BUDGET_S:-540}; ROOT=${ROOT:-runs/ladder}
START_S=${START_S:-120}   # a run's start-up before its first timed step: imports, data check, compile (1.5B: ~90 s)
LADDER=${LADDER:-results/h200/pretrain/scaling-ladder/results.json}
SIZES=("4 4 256" "6 6 384" "8 8 512" "12 12 768")      # layers heads width: ~16M, ~30M, ~51M, ~124M parameters
STEPS=(256 512 1024 2048)                                # x 16,384 tokens: 4.2M, 8.4M, 16.8M, 33.6M tokens
[ -n "${SIZES_ENV:-}" ] && IFS=, read -ra SIZES <<< "$SIZES_ENV"     # e.g. "2 2 32,4 4 64"
[ -n "${STEPS_ENV:-}" ] && read -ra STEPS <<< "$STEPS_ENV"
extra=(); for kv in ${EXTRA_SETS:-}; do extra+=(--set "$kv"); done   # appended last: they win
mkdir -p "$OUT" "$ROOT"
start=$(date +%s)

collect() {
  python3 - "$ROOT" "$LADDER" <<'PY'
import sys
from scalelab.pretrain.calibrate import collect_ladder
doc = collect_ladder(sys.argv[1], sys.argv[2], command="bash bench/gpu_scaling_ladder.sh")
law = doc["law"]
print(f"ladder: {len(doc['points'])} finished runs" + (f"; fit E={law['E']:.3f} A={law['A']:.4g} "
      f"alpha={law['alpha']:.3f} B={law['B']:.4g} beta={law['beta']:.3f}" if law else f"; {doc['law_error']}"))
PY
  cp "$LADDER" "$OUT/scaling_ladder.json" 2>/dev/null
}

finished() {  # run name -> exit 0 when the ladder file already holds it
  python3 -c "import json,sys; d=json.load(open('$LADDER')); sys.exit(0 if any(p['name']=='$1' for p in d['points']) else 1)" \
    2>/dev/null
}

needed_s() {  # the --set list -> predicted seconds of the whole run: steps at the calibrated tokens/s + START_S
  python3 - "$START_S" "$@" <<'PY'
import sys
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.predict import predict
start_s, args = float(sys.argv[1]), sys.argv[2:]
cfg = load_pretrain_config("configs/pretrain/gpt2-124m-fineweb-edu.toml", [a for a in args if a != "--set"])
t = predict(cfg, 1, cfg.run.gpu).throughput
print(round(cfg.train.max_steps * t.tokens_per_step / t.tokens_per_s_low + start_s))
PY
}

todo=0
for size in "${SIZES[@]}"; do
  read -r L H D <<< "$size"
  for S in "${STEPS[@]}"; do
    name="L${L}-d${D}-s${S}"
    finished "$name" && continue
    left=$(( BUDGET_S - ($(date +%s) - start) ))
    if (( left < 60 )); then todo=1; break 2; fi
    lr=$(python3 -c "print(f'{6e-4 * 768 / $D:.3g}')")
    sets=(--set "data.dir=\"$DATA\"" --set run.out_dir=\"$ROOT\" --set run.name=\"$name\" --set run.gpu=\"h200\"
      --set model.n_layer=$L --set model.n_head=$H --set model.n_embd=$D --set train.micro_batch_size=16
      --set train.total_batch_tokens=0 --set train.max_steps=$S --set schedule.warmup_steps=$((S / 10))
      --set optim.lr=$lr --set optim.min_lr_ratio=0.1 --set train.val_every=0 --set train.checkpoint_every=100
      --set data.val_tokens=1048576 --set train.compile=false "${extra[@]}")
    if [ ! -f "$ROOT/$name/checkpoint.pt" ]; then   # a fresh run that cannot finish here is left for the next call
      need=$(needed_s "${sets[@]}" 2> "$ROOT/$name.predict.err") || need=0   # no estimate: start it
      if (( need > left )); then
        echo "== $name: not started, predicted ~$need s with start-up, $left s left (next call)"; todo=1; continue
      fi
    fi
    echo "== $name (lr $lr, $left s left)"
    timeout "$left" python3 -m scalelab.cli pretrain train --config configs/pretrain/gpt2-124m-fineweb-edu.toml \
      "${sets[@]}" > "$ROOT/$name.log" 2>&1
    rc=$?
    tail -3 "$ROOT/$name.log"
    if (( rc == 0 )); then rm -f "$ROOT/$name/checkpoint.pt"
    else echo "$name: exit $rc (124 = cut off by the budget; resumes next call)"; todo=1; fi
    collect
  done
done
collect
tar czf "$OUT/ladder_runs.tgz" --exclude=checkpoint.pt --exclude=hf -C "$ROOT" . 2>/dev/null
(( todo )) && echo "not complete: call again to continue" || echo "complete"
