#!/usr/bin/env bash
# The GRPO measurements on one H200, one PART per call (each fits a 10-minute session; studies are resumable, so a
# call cut short is continued by running the same PART again while the machine is warm):
#   bench       rollout throughput vLLM-colocated vs HF generate, weight-sync cost and its share of a step
#               (random-weight Qwen2.5-1.5B shape)                                   -> $OUT/rollout_bench.json
#   variants    the same bench once per vLLM option set in $VARIANTS, one process each (vLLM does not hand GPU
#               memory back in-process), HF measured in every run as its baseline  -> $OUT/variants/<name>.json,
#                                                                                      $OUT/variants/summary.md
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
#          WHEELS    folders (':'-separated) holding wheels of what the image lacks: peft, tomli_w, and gguf for a
#                    .gguf MODEL; only those are installed, and only when python cannot find them
#                    (default .grpo-gpu/whl:.gpu-carry/whl)
#          STEPS     override train.max_steps of the studies; KS (default 0,1,2,4,8); IS=1; JOBS (runs at once)
#          HACK_TOKENS (default 160), TARGET_CHARS (default 2 x HACK_TOKENS): the hacking study's cap and length target
#          VARIANTS  space-separated <P>x<G>-<kind>[-mp][-lognormal[CAP]], kind: dict (logprobs as a dict per
#                    token, vLLM's default CUDA graphs: the setup before), flat (FlatLogprobs), flat-graphs (flat +
#                    CUDA graphs up to P*G sequences); -mp: vLLM's engine core in its own process
#                    (rollout.server.engine_core=subprocess; syncs by CUDA IPC). UPDATE_VARIANT (default:
#                    the first of VARIANTS; 'none') also times the update and the weight syncs; the others
#                    skip them to save time. NEW = max
#                    new tokens (default 256); every sequence runs to it (random weights emit no EOS).
#                    -lognormal[CAP]: emulated long-tailed response lengths instead (the bench's --lengths
#                    lognormal): one length per sequence, lognormal with mean LN_MEAN (default 256) and sigma
#                    LN_SIGMA (default 0.6) of ln L, clipped to [1, CAP]; CAP replaces NEW, default 512: HF
#                    generate keeps every step's fp32 logits, at 1,024 sequences x 512 x 49,152 x 4 B = 103 GB
#                    (x 1,024 would be 206 GB, over an H200's 139 GiB: the bench refuses it); seed 0 draws mean
#                    236, max/mean 2.2, 5.5% clipped at 1,024 sequences x 512; 32x8-flat-graphs-lognormal1024:
#                    mean 256, max/mean 4.0. A kept json is not remeasured when LN_MEAN / LN_SIGMA change: give
#                    those runs their own RUNS. VARIANTS_BUDGET_S (default 540): seconds from the script's start
#                    (setup included) after which no variant runs; a variant whose json is kept in
#                    $RUNS/variants-new$NEW is not run again, so a second call finishes the list (delete that
#                    folder to measure again)
#          BENCH_MODEL the variants' model (default random:qwen2.5-1.5b; e.g. random:qwen2.5-7b): another shape
#                    appends @<shape> to each variant's json, log and summary name
#          OUT, RUNS outputs (default /tmp/out) and run folders (default ./runs/gpu-grpo)
# Two parts may run at once on two GPUs, each with its own OUT, e.g.
#   CUDA_VISIBLE_DEVICES=1 OUT=/tmp/out/g1 bash bench/gpu_grpo.sh staleness &
#   CUDA_VISIBLE_DEVICES=0 OUT=/tmp/out/g0 bash bench/gpu_grpo.sh seeds; wait
# Nothing here names a GPU (each process uses its first visible one); each study has its own folder under $RUNS;
# setup and the model build/conversion take turns under a lock file. The same study PART twice at once would share
# a study folder: don't; variants twice at once is fine with disjoint VARIANTS (give each its own VLLM_CACHE_ROOT so
# two torch.compile runs do not write one cache). NVML telemetry (grpo/telemetry.py) samples the GPUs that
# CUDA_VISIBLE_DEVICES names, so the neighbour's load is not recorded as this run's.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/out}; SMOL_DIR=${SMOL_DIR:-.grpo-gpu/smol}; WHEELS=${WHEELS:-.grpo-gpu/whl:.gpu-carry/whl}
RUNS=${RUNS:-$PWD/runs/gpu-grpo}; KS=${KS:-0,1,2,4,8}; NEW=${NEW:-256}
VARIANTS=${VARIANTS:-"32x8-dict 32x8-flat 32x8-flat-graphs 64x16-dict 64x16-flat 64x16-flat-graphs"}
BENCH_MODEL=${BENCH_MODEL:-random:qwen2.5-1.5b}  # the variants' model; another shape tags their folder and files
MODEL_TAG=$([ "$BENCH_MODEL" = random:qwen2.5-1.5b ] || echo "@${BENCH_MODEL#random:}")
mkdir -p "$OUT" "$RUNS"

with_lock() {  # $1 = lock file, then a command: invocations started side by side run it one at a time
  local f=$1; shift
  command -v flock > /dev/null || { "$@"; return; }
  ( flock 9 && "$@" ) 9> "$f"
}

wheel_of() {  # the newest $1-*.whl in the $WHEELS folders, or nothing
  local d
  for d in ${WHEELS//:/ }; do ls "$d"/"$1"-*.whl 2> /dev/null; done | sort -V | tail -1
}

install_missing() {  # what python cannot find, from $WHEELS (whoever made /tmp/site or /tmp/vllm-site before)
  local mod whl wheels=()
  for mod in peft tomli_w gguf; do
    python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('$mod') is None)" && continue
    whl=$(wheel_of "$mod")
    if [ -n "$whl" ]; then wheels+=("$whl")
    elif [ "$mod" = gguf ]; then echo "note: no gguf wheel in $WHEELS (only a .gguf MODEL needs one)"
    else echo "setup: python cannot import $mod and $WHEELS holds no $mod-*.whl"; return 1; fi
  done
  [ ${#wheels[@]} -eq 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site "${wheels[@]}" || return 1
  [ -d /tmp/vllm-site/site/vllm ] || bash .gpu-bundle/unpack.sh > /dev/null
}

setup() {
  export PYTHONPATH=$PWD/src:$PWD:/tmp/site:/tmp/vllm-site/site
  with_lock /tmp/gpu-grpo-setup.lock install_missing || return 1
  python3 -c "import torch, transformers, peft, vllm; print('versions', torch.__version__, transformers.__version__,
peft.__version__, vllm.__version__, torch.cuda.get_device_name())" || return 1
  python3 -c "import scipy, pynvml" || echo "warning: scipy (seeds study CI) or pynvml (GPU samples) missing"
}

build_model() {  # the SmolLM2 the studies train: $MODEL (a .gguf is dequantized once), or random weights of the
                 # same config (built once); under a lock, so parts started together do not write it twice
  if [ -n "${MODEL:-}" ]; then
    python3 -c "from scalelab.core.hfmodel import materialize; print(materialize('$MODEL'))" | tail -1; return
  fi
  python3 -c "from scalelab.grpo.randmodel import write_random_folder; import torch
print(write_random_folder('smollm2-135m', '$SMOL_DIR', '$RUNS/smollm2-random', torch.bfloat16, 'cuda'))" | tail -1
}

model() { with_lock "$RUNS/.model.lock" build_model; }

common() {  # --set overrides shared by the studies
  local m; m=$(model)
  echo --set "model.name=\"$m\"" --set "run.out_dir=\"$RUNS\"" ${STEPS:+--set train.max_steps=$STEPS}
}

copy_study() {  # $1 = study folder under $RUNS, $2 = name under $OUT
  mkdir -p "$OUT/$2" && tar -C "$RUNS/$1" --exclude=checkpoint.pt --exclude=rollout -cf - . | tar -C "$OUT/$2" -xf -
}

# ---------------------------------------------------------------------------------------------
# variants

variant_new() {  # $1 = variant name: its max new tokens, CAP of -lognormal[CAP] (default 512), else $NEW
  if [[ $1 =~ -lognormal([0-9]*)$ ]]; then echo "${BASH_REMATCH[1]:-512}"; else echo "$NEW"; fi
}

variant_args() {  # $1 = <P>x<G>-<kind>[-lognormal[CAP]]: the bench flags of that variant
  local batch=${1%%-*} kind=${1#*-} p g new
  p=${batch%x*}; g=${batch#*x}; new=$(variant_new "$1")
  if ! [[ $p =~ ^[0-9]+$ && $g =~ ^[0-9]+$ && $new =~ ^[1-9][0-9]*$ ]]; then
    echo "variant $1: expected <P>x<G>-<kind>[-lognormal[CAP]], e.g. 32x8-flat or 64x16-flat-lognormal512" >&2
    return 2
  fi
  echo --prompts "$p" --group "$g" --max-new-tokens "$new"
  if [[ $kind =~ -lognormal[0-9]*$ ]]; then
    kind=${kind%-lognormal*}
    echo --lengths lognormal --length-mean "${LN_MEAN:-256}" --length-sigma "${LN_SIGMA:-0.6}"
  fi
  if [[ $kind == *-mp ]]; then kind=${kind%-mp}; echo --engine-core subprocess; fi
  case $kind in
    dict) echo --no-flat-logprobs ;;
    flat) ;;
    flat-graphs) echo --cudagraph-max $((p * g)) ;;
    *) echo "variant $1: kind $kind; allowed: dict flat flat-graphs, each optionally -mp, then -lognormal[CAP]" >&2
       return 2 ;;
  esac
}

summarize_variants() {  # $1 = folder of variant jsons: a table of tokens/s, $VARIANTS first, then any others
  python3 - "$1" $(for v in $VARIANTS; do echo "$v$MODEL_TAG"; done) <<'EOF'
import json, sys
from pathlib import Path
folder, names = Path(sys.argv[1]), sys.argv[2:]
names += sorted(f.stem for f in folder.glob("*.json") if f.stem not in names)
print("| variant | seqs | hf tok/s | vllm tok/s | vllm/hf | vllm call / generate ms | flat | graphs up to | core |")
print("|---|---:|---:|---:|---:|---:|---|---:|---|")
for name in names:
    f = folder / f"{name}.json"
    if not f.is_file():
        print(f"| {name} | not measured | | | | | | | |")
        continue
    r = json.loads(f.read_text())
    hf, v = r["engines"]["hf"], r["engines"].get("vllm_colocated")
    eff = r.get("vllm_options", {}).get("effective") or {}
    vt = f"{v['tokens_per_s']:,.0f}" if v else "-"
    calls = f"{v['median_call_ms']:,.0f} / {v['median_ms']:,.0f}" if v else "-"
    ratio = f"{r['ratio_vllm_over_hf']:.2f}" if r.get("ratio_vllm_over_hf") else "-"
    print(f"| {name} | {r['batch']['sequences']} | {hf['tokens_per_s']:,.0f} | {vt} | {ratio} | {calls} | "
          f"{eff.get('flat_logprobs', '-')} | {eff.get('max_cudagraph_capture_size', '-')} | "
          f"{eff.get('engine_core', 'inprocess')} |")
EOF
}

run_variant() {  # $1 = name, $2 = folder, $3 = seconds allowed, $4 = 1 when it also times update and syncs
  local args extra="--no-update --no-sync" new mml
  args=$(variant_args "$1") || return 2
  new=$(variant_new "$1"); mml=$(( new + 256 > 1024 ? new + 256 : 1024 ))  # prompt (< 256 tokens) + cap
  [ "$4" = 1 ] && extra=""
  timeout "$3" python3 bench/grpo_rollout_bench.py --model "$BENCH_MODEL" --tokenizer "$SMOL_DIR" $args \
    --max-model-len "$mml" --repeats 2 $extra --out "$2/$1$MODEL_TAG.json" > "$2/$1$MODEL_TAG.log" 2>&1
}

run_variants() {  # resumable: a variant whose json is in $RUNS from an earlier call (same NEW) is not run again
  local dir=$RUNS/variants-new$NEW name rc=0 left start timed=${UPDATE_VARIANT:-${VARIANTS%% *}}
  for name in $VARIANTS; do variant_args "$name" > /dev/null || return 2; done  # every name, before the GPU works
  mkdir -p "$dir" "$OUT/variants"
  for name in $VARIANTS; do
    if [ -f "$dir/$name$MODEL_TAG.json" ]; then
      echo "variant $name$MODEL_TAG: kept from an earlier call ($dir)"; continue
    fi
    left=$(( ${VARIANTS_BUDGET_S:-540} - SECONDS ))  # SECONDS: since this script started, setup included
    if [ $left -lt 180 ]; then  # a 1,024-sequence variant takes ~150-170 s (estimate); a cut run is wasted
      echo "variant $name: not run, ${left}s of the budget left; run the part again"; rc=3; continue
    fi
    start=$(date +%s)
    run_variant "$name" "$dir" $(( left < 300 ? left : 300 )) $([ "$name" = "$timed" ] && echo 1 || echo 0) \
      || { rc=$?; echo "variant $name failed (exit $rc), $dir/$name$MODEL_TAG.log ends:"
           tail -n 15 "$dir/$name$MODEL_TAG.log"; }
    echo "variant $name wall=$(( $(date +%s) - start ))s"
  done
  cp "$dir"/*.json "$OUT/variants/" 2> /dev/null  # logs stay in $dir: a device call brings back 8 files at most
  summarize_variants "$OUT/variants" | tee "$OUT/variants/summary$MODEL_TAG.md"
  return $rc
}

# ---------------------------------------------------------------------------------------------
# parts

run_part() {
  local start=$(date +%s) rc=0
  case $1 in
    bench) timeout 540 python3 bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer "$SMOL_DIR" \
             --prompts 32 --group 8 --max-new-tokens 256 --out "$OUT/rollout_bench.json" || rc=$? ;;
    variants) run_variants || rc=$? ;;
    seeds) timeout 540 python3 -m scalelab.cli grpo seeds --config configs/grpo/smollm2-curriculum-h200.toml \
             $(common) --seeds 0,1,2 --jobs ${JOBS:-3} || rc=$?
           copy_study smollm2-curriculum seeds ;;
    staleness) timeout 540 python3 -m scalelab.cli grpo staleness --config configs/grpo/smollm2-arith-h200.toml \
             $(common) --set 'run.name="smollm2-staleness"' --k "$KS" ${IS:+--is-correction} --jobs ${JOBS:-5} || rc=$?
           copy_study smollm2-staleness staleness ;;
    # the length exploit pays min(chars / target, 2), target = 2 x max_new_tokens by default: at the config's 32
    # tokens the base model's ~100-char rambles already saturate it (measured on an H200: no length left to gain),
    # so the study runs with a 160-token cap: a 320-char target, pay saturating near the cap
    hacking) timeout 540 python3 -m scalelab.cli grpo hacking --config configs/grpo/smollm2-arith-h200.toml \
             $(common) --set 'run.name="smollm2-hacking"' ${TARGET_CHARS:+--target-chars $TARGET_CHARS} \
             --set rollout.max_new_tokens=${HACK_TOKENS:-160} --jobs ${JOBS:-2} || rc=$?
           copy_study smollm2-hacking hacking ;;
    tests) timeout 540 python3 -m pytest -q -p no:cacheprovider tests/grpo -m "not slow" > "$OUT/pytest.log" 2>&1 || rc=$?
           tail -3 "$OUT/pytest.log" ;;
    *) echo "unknown part $1 (bench variants seeds staleness hacking tests)"; return 2 ;;
  esac
  echo "$1 exit=$rc wall=$(( $(date +%s) - start ))s"
}

setup || { echo "setup failed"; exit 1; }
for part in "$@"; do run_part "$part"; done
