#!/usr/bin/env bash
# Preference tuning of the real Qwen2.5-Coder-1.5B-Instruct on one H200 (configs/dpo/qwen2.5-coder-1.5b-gsm8k-h200.toml):
# the verifier set from the base's own GSM8K train answers, the sweep of its [sweep] table (LoRA-DPO at beta 0.05 /
# 0.1 / 0.3, IPO at tau 1.0, ORPO at lambda 0.1), the run its [selection] rule chooses from the training-time
# held-out numbers, the regression battery of the base and every run (the base and the chosen run on all 14,042
# MMLU items, the other rows on the fixed 2,000-item subset, paired on those items), the judge check with the
# base itself as the judge, and the HH-RLHF off-policy run (configs/dpo/qwen2.5-coder-1.5b-hh-h200.toml).
#   bash bench/gpu_dpo_real.sh prep [CHUNK_DIR [SEED_TGZ]]  here: the chunk set (the GGUF, the wheels the image
#                                                    lacks, the evaluation and preference data, and optionally an
#                                                    earlier window's runs.tgz) in 46 MiB chunks (default
#                                                    /tmp/dpo-chunks); downloads the 1.1 GB GGUF once
#   bash bench/gpu_dpo_real.sh bundle               unpack the vLLM bundle (carry .gpu-bundle)
#   bash bench/gpu_dpo_real.sh setup CHUNK_DIR      join the carried chunk set (bench/TRANSFER.md), install the
#                                                    wheels into /tmp/site, unpack the data, dequantize the model
#   bash bench/gpu_dpo_real.sh launch               start `work` in a session of its own (it outlives the call)
#   bash bench/gpu_dpo_real.sh poll SECONDS         wait up to SECONDS (or until work ends), then results to
#                                                    $OUT/runs.tgz (split into $OUT/runs/ chunks past 15 MiB)
#   bash bench/gpu_dpo_real.sh stop [SECONDS]       stop the launched work: the running part as at the window's
#                                                    end (its servers with it), no later part; `launch` refuses
#                                                    while one runs (two parts on one GPU starve each other)
#   bash bench/gpu_dpo_real.sh ship RUN K           a trained run's adapter (74 MB with its weights) home: the
#                                                    K-th four of its 15 MiB chunks into $OUT/adapter (K = 0, 1)
# `work` runs PARTS in turn, each skipped when done and resumable when cut by the window (WORK_S):
#   pairs    vLLM serves the base as "base" on port 8000 (the config's verifier.sampler_url, part of the set's
#            manifest key) at half the GPU; `dpo data` samples 8 answers per GSM8K train question and keeps one
#            right/wrong pair per mixed question; the server stops. Each finished batch of 256 questions is
#            appended to gsm8k/preferences.samples.jsonl (dpo.sample_log), so a cut window keeps them and the next
#            resumes (4 batches in flight: verifier.concurrent_batches). Planned at ~12 min (server start ~2, ~60k
#            answers of ~300 tokens ~10); measured at vLLM's default 1,024 sequences at once, one request at a
#            time: 2,560 of 7,473 prompts in ~7 min (KV cache <9% used), so PAIRS_MAX_SEQS (default 2048) raises
#            the server's --max-num-seqs. Should sampling_ab show the per-request seeds cost most of the time,
#            set verifier.request_seeds = false in CONFIG itself (not by --set here: the sweep finds the set by
#            the config's manifest key).
#   sweep    the [sweep] runs one after another (`dpo sweep --skip-trained --only RUN`: a finished run is kept,
#            a cut one resumes from its last checkpoint, train.save_steps 50), each run's tuned battery side (the
#            MMLU subset) in the background as soon as it has trained, beside the next run's training, and the
#            base side (full MMLU, once for the sweep) beside the first. A run starts only with RUN_MIN_S left, as
#            its weights do not travel back: its side has to finish in the window it trained in. The side's
#            records are keyed by the sha256 written beside the weights, so they stay usable without them. Per
#            DPO/IPO run ~310 steps x ~1.5 s (32 pairs x 2 x ~900 padded tokens; policy forward + backward +
#            reference forward at ~35% of bf16 peak) + 32 margin evaluations of 512 held-out pairs: ~10 min; ORPO
#            (no reference) ~7 min; base side ~15 min (MMLU 5-shot ~8, TruthfulQA ~1, 964 own-task + 1,319 GSM8K
#            greedy answers ~6), each tuned side ~9 min. GPU ~50 min over several windows.
#   battery  once the base side and every tuned side are stored: every run's battery.json from the records (no
#            weights needed), the sweep report, and the chosen run (`dpo select`) again on all of MMLU (its base
#            record reused): its weights carried in (`ship` brought them home; they go out in SEED), else
#            trained again. GPU ~8 min (+10 to retrain).
#   judge    vLLM serves the base as "judge" (30% of the GPU): `dpo judge-check` (GPT-4's reference answers
#            against the base's, blind), then MT-Bench for the base and the chosen run with that judge and
#            battery.judge_check, so a failed check reads "not measured: judge too weak" (evals.mtbench's own
#            gate runs too). GPU ~13 min (server ~2, check ~1, 2 x 160 answers ~8, ~330 ratings ~2).
#   hh       `dpo train` on HH-RLHF harmless-base: 258 steps, its held-out reward accuracy and margin. GPU ~5 min.
#   sampling_ab  not in the default PARTS: bench/verifier_sampling_ab.py on the first AB_PROMPTS (512) prompts of
#            the pairs part's set, AB_VARIANTS (per-request seeds or not, --max-num-seqs, requests in flight),
#            into $RUNS/sampling-ab/results.json, AB_PREDICT (ratios to the first variant) written before it
#            runs. GPU ~8 min (two server starts, 4 variants x 2 runs of ~1 min). The default predictions: a step
#            of 1,024 seeded sequences took ~60 ms (17k tok/s), where the weights and KV reads of a 1.5B need ~10;
#            if vLLM's per-row seeded noise loop is the rest (~50 us a sequence), 2,048 seeded sequences gain
#            little (1.1x), dropping the seeds gains most (2.5x), and 4 requests in flight remove each request's
#            drained tail (1.2x).
#   baseline not in the default PARTS: the model's own baseline battery (`evals battery --tasks all`: GSM8K on the
#            reference protocol, MATH-500, HumanEval, MBPP, IFEval-lite, tool calls through vLLM; MMLU, TruthfulQA,
#            ARC-e/ARC-c, HellaSwag, PIQA through lm-eval), resumable per task, into $RUNS/baseline-$NAME; from
#            the same chunk set. GPU ~30 min (the 0.5B's took ~25 with MMLU 5-shot at 8 min).
# In all ~120 GPU minutes, more than one machine lease (30 min, ~5 of them moving the chunks): each lease's
# `poll` brings back runs.tgz (no weights, no checkpoints), and the next lease's prep carries it in as SEED_TGZ;
# `work` restores it first (files already on the machine win). Weights travel only when asked: `ship RUN 0` and
# `ship RUN 1` after a run trains bring its adapter home in two calls (~20 s), for the window that needs it again
# (the chosen run's full MMLU and MT-Bench); a run whose weights are missing there is trained again, and records
# keyed by other weights are measured again. The parts run in order, so a lease continues where the last stopped.
#   env: OUT (default /tmp/out), RUNS (default /tmp/dpo-runs), WORK_S (default 1140), DATA (default /tmp/data),
#        TREE (the copy of the tree `launch` runs from, default /tmp/tree-dpo: bench/snapshot.sh),
#        PARTS (default "pairs sweep battery judge hh"), SWEEP_ONLY (runs of the sweep to train now, e.g.
#        "dpo-beta0.1,ipo-beta1"), RUN_MIN_S (default 1080: the seconds a run's training and its tuned battery
#        side need, below which the sweep starts no further run in this window), SIDE_BESIDE (default 1: a run's
#        tuned side beside the next run's training; 0: after it, when the GPU's memory holds only one of them),
#        SEED (default /tmp/seed.tgz when setup left one), PAIRS_MAX_SEQS (default 2048), LM_EVAL_BS (the
#        baseline's lm-eval batch, default 16: at 8 HellaSwag ran 235 requests/s; at 32 MMLU's first batch asked
#        for 26.5 GiB of log-softmax beside 58.6 GiB in use and ran out of an H100's memory), BASELINE_TASKS (the
#        baseline's --tasks, default all; "mc" for the multiple-choice side alone when the generative tasks are
#        stored elsewhere),
#        CONFIG / HH_CONFIG (the two configs), SCALELAB_GIT_SHA (the commit, as the copied tree has no .git)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1 TRL_EXPERIMENTAL_SILENCE=1 \
       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/dpo-runs}; WORK_S=${WORK_S:-1140}; DATA=${DATA:-/tmp/data}
PARTS=${PARTS:-"pairs sweep battery judge hh"}; RUN_MIN_S=${RUN_MIN_S:-1080}; SIDE_BESIDE=${SIDE_BESIDE:-1}
PAIRS_MAX_SEQS=${PAIRS_MAX_SEQS:-2048}; LM_EVAL_BS=${LM_EVAL_BS:-16}; BASELINE_TASKS=${BASELINE_TASKS:-all}
export SCALELAB_CACHE=${SCALELAB_CACHE:-/tmp/scalelab-cache} SCALELAB_SHARED_DATA=$DATA
export PYTHONPATH=$PWD/src:/tmp/site:/tmp/vllm-site/site
[[ -n ${SCALELAB_GIT_SHA:-} ]] || export SCALELAB_GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
LOGS=$RUNS/logs; SWEEP=$RUNS/gsm8k
NAME=qwen2.5-coder-1.5b-instruct-q4km
GGUF_REL=gguf/$NAME/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
CONFIG=${CONFIG:-configs/dpo/qwen2.5-coder-1.5b-gsm8k-h200.toml}
HH_CONFIG=${HH_CONFIG:-configs/dpo/qwen2.5-coder-1.5b-hh-h200.toml}
PORT=8000
BSETS=(--set "battery.data_dir=\"$DATA\"")
mkdir -p "$OUT" "$RUNS" "$LOGS"
sl() { python3 -m scalelab.cli "$@"; }
END=$((SECONDS + WORK_S))  # every command of this call stops by then
left() { echo $((END - SECONDS - ${1:-0})); }
bounded() {  # the command, stopped (SIGINT: checkpoints and part records stay) at the window's end
  local t; t=$(left); [ "$t" -gt 0 ] || return 124
  timeout -s INT "$t" "$@"
}
done_part() { [ -f "$RUNS/.done-$1" ]; }
mark() { date -u +%FT%TZ > "$RUNS/.done-$1"; echo "$1: done after $SECONDS s" >> "$LOGS/work.log"; }
enough() {  # $1 = part, $2 = seconds it must have to be worth starting
  [ "$(left)" -ge "$2" ] && return 0
  echo "$1: not started, $(left) s left in this window (< $2)" >> "$LOGS/work.log"; return 1
}
served() {  # $1 = served name, $2 = GPU memory share, $3 = max model length, $4 = log name, then more serve
           # options up to a "--" (or none), then the command
  local name=$1 mem=$2 len=$3 log=$4 opts=(); shift 4
  if [[ " $* " == *" -- "* ]]; then while [ "$1" != "--" ]; do opts+=("$1"); shift; done; shift; fi
  bounded python3 bench/gpu_dpo_real.py serve "$NAME" --served "$name" --port "$PORT" \
    --gpu-memory-utilization "$mem" --max-model-len "$len" --log "$LOGS/vllm-$log.log" "${opts[@]}" -- "$@"
}

# pure-Python wheels the image lacks (/work/.library/device/KINDS.md lists what it has: accelerate, peft,
# pyarrow, sacrebleu, scikit-learn, xxhash, ...); sqlitedict, word2number and rouge-score ship no wheel and are
# imported by lm-eval only for its request cache and metrics this battery does not use
WHEELS="trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 tomli_w==1.2.0 gguf==0.19.0 lm_eval==0.4.13
        evaluate==0.4.6 more_itertools==11.2.1 pytablewriter==0.38.0 DataProperty==0.37.0 mbstrdecoder==1.1.5
        typepy==0.3.1 tabledata==1.3.5 tcolorpy==0.1.7 pathvalidate==3.3.1 chardet==6.0.0.post1"
# of ../shared/data; math500, hellaswag and llmfoundry_icl (ARC, PIQA) for the baseline part
DATA_SETS="README.md gsm8k mmlu truthfulqa mt_bench humaneval mbpp hh-rlhf math500 hellaswag llmfoundry_icl"
prep() {  # here: $1 = chunk folder, $2 = an earlier window's runs.tgz to carry back in (optional)
  local chunks=${1:-/tmp/dpo-chunks} seed=${2:-} src=/tmp/dpo-carry-src py=${PY:-python3}
  rm -rf "$src" "$chunks" && mkdir -p "$src/whl" || return 1
  PYTHONPATH=src "$py" -m scalelab.cli models fetch "$NAME" || return 1
  cp "$(PYTHONPATH=src "$py" -m scalelab.cli models path "$NAME" --gguf)" "$src/model.gguf" || return 1
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$src/whl" $WHEELS || return 1
  tar -C "${SHARED_DATA:-../shared/data}" -cJf "$src/data.tar.xz" $DATA_SETS || return 1
  [ -z "$seed" ] || cp "$seed" "$src/seed.tgz" || return 1
  PYTHONPATH=src "$py" -m scalelab.core.chunks split "$src" "$chunks" --max-mib 46
}

setup() {  # $1 = the folder holding the chunk set's manifest and chunks
  local t0=$SECONDS
  python3 -m scalelab.core.chunks join /tmp/carry "$1" || return 1
  rm -rf "$1"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/carry/whl/*.whl || return 1
  mkdir -p "$DATA" && tar -C "$DATA" -xJf /tmp/carry/data.tar.xz || return 1
  [ ! -f /tmp/carry/seed.tgz ] || mv /tmp/carry/seed.tgz /tmp/seed.tgz
  mkdir -p "$SCALELAB_CACHE/$(dirname "$GGUF_REL")" && mv /tmp/carry/model.gguf "$SCALELAB_CACHE/$GGUF_REL" || return 1
  echo "setup: joined and installed in $((SECONDS - t0)) s"
  sl models path "$NAME" || return 1  # checks the GGUF's pinned sha256, dequantizes once into the cache
  echo "setup: model ready after $((SECONDS - t0)) s"
  python3 -c "import torch, transformers, peft, trl, datasets, lm_eval.evaluator, gguf, tomli_w, vllm
from trl.experimental.orpo import ORPOTrainer
print('versions torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__,
      'trl', trl.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name())"
}

restore() {  # an earlier window's results (SEED, a runs.tgz), once per machine; files already here win
  local seed=${SEED:-/tmp/seed.tgz}
  [ -f "$seed" ] && [ ! -f "$RUNS/.seeded" ] || return 0
  tar -xzf "$seed" -C "$RUNS" --skip-old-files --exclude=work.done && date -u +%FT%TZ > "$RUNS/.seeded"
  echo "restored $seed" >> "$LOGS/work.log"
}

provenance() {  # one record per window: the commit, the window and the knobs
  python3 - "$SCALELAB_GIT_SHA" "$WORK_S" "$PARTS" "${SWEEP_ONLY:-}" "$RUN_MIN_S" "$CONFIG" "$HH_CONFIG" \
    "$BASELINE_TASKS" "$LM_EVAL_BS" "$SIDE_BESIDE" > "$RUNS/provenance-window-$(date -u +%Y%m%dT%H%M%SZ).json" <<'PY'
import json, sys, time
sha, work_s, parts, only, run_min_s, config, hh, tasks, bs, beside = sys.argv[1:]
command = f"SCALELAB_GIT_SHA={sha} PARTS='{parts}' WORK_S={work_s}"
if "baseline" in parts.split():
    command += f" BASELINE_TASKS={tasks} LM_EVAL_BS={bs}"
if "sweep" in parts.split():  # the sweep's knobs where they are not the defaults
    command += (f" SWEEP_ONLY={only}" if only else "") + (f" RUN_MIN_S={run_min_s}" if run_min_s != "1080" else "") \
        + (" SIDE_BESIDE=0" if beside == "0" else "")
print(json.dumps({"command": command + " bash bench/gpu_dpo_real.sh launch", "git_sha": sha,
                  "started_unix": time.time(), "work_s": int(work_s), "parts": parts.split(), "sweep_only": only,
                  "run_min_s": int(run_min_s), "side_beside": beside == "1", "config": config, "hh_config": hh,
                  "baseline_tasks": tasks,
                  "lm_eval_batch_size": int(bs)}, indent=1))
PY
}

pairs() {  # the verifier set, sampled from the base through vLLM and graded by the GSM8K verifier
  done_part pairs && return 0
  enough pairs 300 || return 0   # server start ~2 min, then every finished batch is kept
  served base 0.5 2048 pairs --max-num-seqs "$PAIRS_MAX_SEQS" -- python3 -m scalelab.cli dpo data --config "$CONFIG" --show 1 \
    --set "run.out_dir=\"$RUNS\"" --set 'run.name="gsm8k-pairs"' --set "data.path=\"$SWEEP/preferences.jsonl\"" \
    >> "$LOGS/pairs.log" 2>&1 && mark pairs
}

has_weights() { [ -f "$SWEEP/$1/adapter/adapter_model.safetensors" ]; }

train_run() {  # $1 = a planned run: trained, or resumed from its checkpoint; a finished one with weights is kept
  bounded python3 -m scalelab.cli dpo sweep --config "$CONFIG" --name gsm8k --skip-trained --only "$1" \
    --set "run.out_dir=\"$RUNS\"" "${BSETS[@]}" >> "$LOGS/sweep.log" 2>&1
  has_weights "$1"
}

sweep() {  # each planned run in turn (SWEEP_ONLY: these of them), then its tuned battery side in the background
  # while the next trains: the side's records are keyed by the sha256 recorded beside the weights, so no run's
  # weights have to outlive the window they were trained in. The base side starts first, beside the first run.
  done_part pairs || { echo "sweep: no verifier set yet (pairs)" >> "$LOGS/work.log"; return 1; }
  local run pids=()
  done_part base-side || { base_side & pids+=($!); }
  for run in $(planned); do
    [[ -z ${SWEEP_ONLY:-} || ",$SWEEP_ONLY," == *",$run,"* ]] || continue
    done_part "tuned-$run" && continue
    if ! has_weights "$run"; then
      enough "sweep $run" "$RUN_MIN_S" || break  # its training and its side both in this window
      train_run "$run" || { echo "sweep: $run did not finish training" >> "$LOGS/work.log"; break; }
    fi
    if [ "$SIDE_BESIDE" = 1 ]; then
      { battery_side "$SWEEP/$run" tuned && mark "tuned-$run"; } & pids+=($!)
    else
      battery_side "$SWEEP/$run" tuned && mark "tuned-$run"
    fi
  done
  wait "${pids[@]}"
}

base_side() {  # the base side, from the first planned run's config in the sweep's hidden .base folder (dpo
  # battery reads a run folder's config.toml; no run's folder need exist yet): records go to the sweep's battery-base
  local base=$SWEEP/.base
  [ -f "$base/config.toml" ] || python3 bench/gpu_dpo_real.py base-config "$CONFIG" "$base" \
    --set "run.out_dir=\"$RUNS\"" "${BSETS[@]}" >> "$LOGS/work.log" 2>&1 || return 1
  battery_side "$base" base && mark base-side
}

battery_side() {  # $1 = a run or the sweep folder, $2 = side, then --set overrides; a log per target and side
  local target=$1 side=$2; shift 2
  bounded python3 -m scalelab.cli dpo battery "$target" --side "$side" "${BSETS[@]}" "$@" \
    >> "$LOGS/battery-$(basename "$target")-$side.log" 2>&1
}

planned() { python3 bench/gpu_dpo_real.py plan "$CONFIG"; }  # the run names of the config's [sweep]

chosen_run() {  # the run the config's [selection] rule picks from the training-time held-out numbers
  sl dpo select "$SWEEP" --name-only 2>> "$LOGS/battery.log"
}

with_weights() {  # $1 = run: its weights here: carried in (`ship` took them home), else trained again
  has_weights "$1" && return 0
  enough "retrain $1" "$RUN_MIN_S" || return 1
  train_run "$1"
}

battery() {  # once the base side and every run's tuned side are stored: every battery.json from the records (no
  # weights needed), the sweep's report, then the chosen run on all of MMLU
  done_part battery && return 0
  local part chosen
  for part in base-side $(printf 'tuned-%s ' $(planned)); do
    done_part "$part" || { echo "battery: $part not stored yet (sweep)" >> "$LOGS/work.log"; return 1; }
  done
  battery_side "$SWEEP" both || return 1
  chosen=$(chosen_run) || return 1
  echo "battery: chosen $chosen" >> "$LOGS/work.log"
  with_weights "$chosen" || return 1
  enough "battery $chosen on all of MMLU" 600 || return 1
  battery_side "$SWEEP/$chosen" both --set battery.mmlu_subset=0 || return 1
  sl dpo report "$SWEEP" >> "$LOGS/battery.log" 2>&1 && mark battery
}

judge() {  # the 1.5B base as the judge: the check, then MT-Bench of the base and the chosen run
  done_part judge && return 0
  done_part battery || { echo "judge: the battery has not finished" >> "$LOGS/work.log"; return 1; }
  local chosen
  chosen=$(chosen_run) || return 1
  with_weights "$chosen" || return 1
  enough judge 600 || return 0
  served judge 0.3 8192 judge bash "$0" judged >> "$LOGS/judge.log" 2>&1 && mark judge
}

judged() {  # under the judge's server ($SERVER_URL): GPT-4 vs the base's answers, then MT-Bench where it passed
  local check=$SWEEP/judge-check chosen
  sl dpo judge-check --config "$CONFIG" "${BSETS[@]}" --judge-url "$SERVER_URL" --judge-model judge \
    --out "$check" || return 1
  chosen=$(sl dpo select "$SWEEP" --name-only) || return 1
  sl dpo battery "$SWEEP/$chosen" "${BSETS[@]}" --set battery.mmlu_subset=0 \
    --set "battery.judge_url=\"$SERVER_URL\"" --set 'battery.judge_model="judge"' \
    --set "battery.judge_check=\"$check/judge_check.json\"" || return 1
  sl dpo report "$SWEEP"
}

ship() {  # $1 = run, $2 = K: its adapter folder (weights included) in 15 MiB chunks, the K-th four of them and the
  # manifest into $OUT/adapter (what one call brings back); here, `python3 -m scalelab.core.chunks join` the
  # calls' folders into the next window's SEED (gsm8k/RUN/adapter), and `with_weights` finds them there
  local run=${1:?usage: ship RUN K} k=${2:?usage: ship RUN K} parts i
  has_weights "$run" || { echo "ship: $run has no weights here" >&2; return 1; }
  parts=$RUNS/.ship/$run-$(sha256sum "$SWEEP/$run/adapter/adapter_model.safetensors" | cut -c1-16)  # these weights'
  [ -f "$parts/adapter.manifest.json" ] || python3 -m scalelab.core.chunks split "$SWEEP/$run/adapter" "$parts" \
    --max-mib 15 > /dev/null || return 1
  rm -rf "$OUT/adapter" && mkdir -p "$OUT/adapter" && cp "$parts/adapter.manifest.json" "$OUT/adapter/" || return 1
  for i in 0 1 2 3; do
    local f; f=$(printf "%s/adapter.part%04d" "$parts" $((4 * k + i)))
    [ ! -f "$f" ] || cp "$f" "$OUT/adapter/"
  done
  ls "$OUT/adapter" | grep -c part
}

hh() {  # HH-RLHF harmless-base, off-policy: its held-out reward accuracy and margin are the result
  done_part hh && return 0
  enough hh 420 || return 0
  bounded python3 -m scalelab.cli dpo train --config "$HH_CONFIG" --set "run.out_dir=\"$RUNS/hh\"" \
    --set "data.path=\"$DATA/hh-rlhf/harmless-base_test.jsonl.gz\"" >> "$LOGS/hh.log" 2>&1 && mark hh
}

sampling_ab() {  # not in the default PARTS: the pairs part's sampling under server/request settings, A B B A
  done_part sampling_ab && return 0
  enough sampling_ab 600 || return 0
  bounded python3 bench/verifier_sampling_ab.py --config "$CONFIG" --model-dir "$(sl models path "$NAME")" \
    --prompts "${AB_PROMPTS:-512}" --variants "${AB_VARIANTS:-seeded@1024,seeded@2048,unseeded@2048,seeded@2048x4}" \
    --predict "${AB_PREDICT:-seeded@2048=1.1,unseeded@2048=2.5,seeded@2048x4=1.2}" \
    --log-dir "$LOGS/sampling-ab" --out "$RUNS/sampling-ab/results.json" >> "$LOGS/sampling_ab.log" 2>&1 \
    && mark sampling_ab
}

baseline() {  # the base model's own battery, each task stored when it ends (a cut window resumes)
  done_part baseline && return 0
  enough baseline 300 || return 0
  bounded python3 -m scalelab.cli evals battery --model "$NAME" --out "$RUNS/baseline-$NAME" --data-dir "$DATA" \
    --tasks "$BASELINE_TASKS" --max-model-len 8192 --lm-eval-batch-size "$LM_EVAL_BS" >> "$LOGS/baseline.log" 2>&1 &&
    mark baseline
}

pack() {  # the run folders without weights, checkpoints or caches, as one archive (chunks past 15 MiB)
  rm -rf "$OUT/runs" "$OUT/runs.tgz"
  tar -czf "$OUT/runs.tgz.tmp" -C "$RUNS" --exclude='checkpoint*' --exclude='*.safetensors' --exclude='*.pt' \
    --exclude=merged --exclude=.locks --exclude=lm-eval-requests --exclude=.seeded --exclude=work.done \
    --exclude=.ship . \
    && mv "$OUT/runs.tgz.tmp" "$OUT/runs.tgz" || return 1
  if [ "$(stat -c %s "$OUT/runs.tgz")" -gt $((15 * 1024 * 1024)) ]; then
    python3 -m scalelab.core.chunks split "$OUT/runs.tgz" "$OUT/runs" --max-mib 15 && rm "$OUT/runs.tgz"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
}

work() {
  local part rc
  restore
  provenance
  for part in $PARTS; do
    echo "== $part at $SECONDS s, $(left) s left" >> "$LOGS/work.log"
    "$part"; rc=$?
    [ "$rc" -eq 0 ] || echo "$part: exit $rc" >> "$LOGS/work.log"
  done
  python3 bench/gpu_dpo_real.py status "$RUNS" > "$LOGS/status.log" 2>&1
  echo "work done after $SECONDS s" > "$RUNS/work.done"
}

poll() {  # $1 = seconds to wait at most
  local until=$((SECONDS + $1)) f
  while [ $SECONDS -lt "$until" ] && [ ! -f "$RUNS/work.done" ]; do sleep 10; done
  pack
  python3 bench/gpu_dpo_real.py status "$RUNS"
  for f in "$LOGS"/*.log; do echo "== $(basename "$f")"; grep -E "^step|held-out|sampling|battery:|rror|judge|skipped|exit" \
    "$f" | tail -3 | cut -c1-220; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  cat "$RUNS/work.done" 2>/dev/null || echo "work still running"
}

running() { [ -f "$RUNS/work.pid" ] && kill -0 "$(cat "$RUNS/work.pid")" 2> /dev/null; }

stop() {  # $1 = seconds to wait. The work shell first (SIGTERM: no later part starts), then SIGINT to every other
          # process of its session but `timeout` (which would forward a second one): each part stops as at the
          # window's end, its vLLM servers with it (they run in sessions of their own, stopped by the processes
          # that started them); SIGKILL to what is left after $1 s; then what still holds the GPU
  local sid t=0 p
  running || { echo "stop: no work running"; return 0; }
  sid=$(cat "$RUNS/work.pid")
  kill -TERM "$sid" 2> /dev/null
  for p in $(pgrep -s "$sid"); do [ "$(ps -o comm= -p "$p")" = timeout ] || kill -INT "$p" 2> /dev/null; done
  while pgrep -s "$sid" > /dev/null && [ "$t" -lt "$1" ]; do sleep 2; t=$((t + 2)); done
  if pgrep -s "$sid" > /dev/null; then echo "stop: still running after $1 s, killed"; pkill -KILL -s "$sid"; fi
  echo "work stopped by \`stop\` after $SECONDS s" > "$RUNS/work.done"
  echo "stop: work $sid stopped after $t s; GPU: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
}

case "${1:-}" in
  prep) prep "${2:-}" "${3:-}" ;;
  bundle) bash .gpu-bundle/unpack.sh | tail -1 ;;
  setup) setup "${2:?usage: bash bench/gpu_dpo_real.sh setup CHUNK_DIR}" ;;
  launch) if running; then echo "work is already running (pid $(cat "$RUNS/work.pid")): stop it first" >&2; exit 1; fi
          rm -f "$RUNS/work.done"; cd "$(bash bench/snapshot.sh "${TREE:-/tmp/tree-dpo}")" || exit 1
          setsid nohup bash "$0" work > "$RUNS/work.out" 2>&1 < /dev/null &
          echo $! > "$RUNS/work.pid"; sleep 2; echo "launched work (pid $!), window ${WORK_S} s" ;;
  stop) stop "${2:-90}" ;;
  work) work ;;
  judged) judged ;;
  ship) ship "${2:-}" "${3:-}" ;;
  poll) poll "${2:?usage: bash bench/gpu_dpo_real.sh poll SECONDS}" ;;
  status) python3 bench/gpu_dpo_real.py status "$RUNS" ;;
  *) echo "usage: bash bench/gpu_dpo_real.sh prep [CHUNK_DIR [SEED_TGZ]] | bundle | setup CHUNK_DIR | launch | work |" \
          "poll SECONDS | stop [SECONDS] | ship RUN K | status" >&2; exit 2 ;;
esac
