#!/usr/bin/env bash
# GPT-2 124M training throughput per recipe variant on one GPU, against the plain baseline in the same run
# (GPT-2 architecture, bf16 autocast, torch.compile, SDPA, fused AdamW; 524,288 tokens/step, B=64, T=1024).
# Variants switch the SDPA kernel (train.attention) and FP8 matmuls (train.fp8). Each runs STEPS optimizer steps
# on the carried ShareGPT shards; the summary (median step after 3 warm-up steps) goes to $OUT/pretrain_variants.json.
#   usage: GPUS="0 1" bash bench/gpu_pretrain_variants.sh [VARIANT ...]   (default: the first six; spread over GPUS,
#   one variant per GPU at a time, so every variant trains alone on its GPU). Named only: chunks8 / cudnn-chunks8
#   (chunked LM head + loss, train.loss_chunks), muon / cudnn-fp8-all-muon (the Muon step's cost), and
#   cudnn-chunks8-b128 / cudnn-fp8-blocks-chunks8-b128 (B=128, grad-accum 4: the chunked loss frees the memory;
#   FP8 in the blocks, the head in bf16 inside the chunked loss; -fast: the forward FP8 GEMMs with fast accumulation),
#   cudnn-fp8-all-chunks8-b128[-fast] / cudnn-fp8-all-chunks8-b256-fast (the chunked head's matmuls in FP8 too),
#   ...-tk: the chunks' softmax, loss and gradient in the Triton kernel (train.loss_kernel="triton"),
#   cudnn-fp8row-{blocks,all}-chunks8-b128-tk[-fast] (train.fp8_scaling="row": per-row scales, weight gradient in bf16),
#   ...-mk: Inductor keeps the faster of one-pass and looped reductions (train.compile_multi_kernel),
#   ...-tk8: the loss kernel writes the FP8 head's logit gradient as e5m2 itself (train.loss_kernel="triton-e5m2"),
#   ...-gk: GELU and its gradient fused with their per-row FP8 casts (train.fp8_gelu_kernel),
#   cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk: the same at B=256, grad-accum 2 (half the per-micro-step casts
#   of the weights and half the launches; 16 chunks keep each loss chunk at 16k rows),
#   ...-at: the same with Inductor autotuning its kernels (max-autotune-no-cudagraphs; fails in torch 2.11: its
#   Triton GEMM template takes no FP8 operand), ...-cd: Inductor's own Triton kernels tuned by coordinate descent
#   at first call, GEMMs left alone (train.compile_tune_kernels; 322 s of compile, then non-finite gradients at
#   step 0 in torch 2.11: results/h200/pretrain/variants-round6/results.json), plain-noprefetch / ...-gk-noprefetch (the
#   batches copied from pageable memory in turn, train.batch_prefetch=false: the A/B of the pinned one-ahead loader),
#   ...-gk-bf16res (train.residual_dtype="compute": the residual stream and LayerNorm outputs in bf16, as llm.c),
#   cudnn-fp8-all-autotune / cudnn-fp8-all-graphs (train.compile_mode: autotuned kernels, then CUDA graphs too;
#   autotuning compiles for minutes: raise VARIANT_TIMEOUT). A name "_" holds a place in the round-robin and runs
#   nothing: GPUS="0 1" ... plain cudnn-fp8-all-autotune cudnn-fp8-all _ puts both short ones on GPU 0. Each variant
#   is compared with the plain run on its own GPU: on two, name plain2 second (GPUS="0 1" plain plain2 A B ...).
#   Data on the device machine: carry .gpu-data/z, `bash bench/gpu_data.sh unpack /tmp/d`, then DATA=/tmp/d.
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; STEPS=${STEPS:-12}; DATA=${DATA:-.gpu-data/sharegpt}; mkdir -p "$OUT"
declare -A VARIANTS=(
  [plain]=""
  [plain2]=""
  [cudnn]="--set train.attention=\"cudnn\""
  [fp8-head]="--set train.fp8=\"lm_head\""
  [fp8-all]="--set train.fp8=\"all\""
  [cudnn-fp8-head]="--set train.attention=\"cudnn\" --set train.fp8=\"lm_head\""
  [cudnn-fp8-all]="--set train.attention=\"cudnn\" --set train.fp8=\"all\""
  [chunks8]="--set train.loss_chunks=8"
  [cudnn-chunks8]="--set train.attention=\"cudnn\" --set train.loss_chunks=8"
  [muon]="--set train.optimizer=\"muon\""
  [cudnn-fp8-all-muon]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.optimizer=\"muon\""
  [cudnn-fp8-all-autotune]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.compile_mode=\"max-autotune-no-cudagraphs\""
  [cudnn-chunks8-b128]="--set train.attention=\"cudnn\" --set train.loss_chunks=8 --set train.micro_batch_size=128"
  [cudnn-fp8-blocks-chunks8-b128]="--set train.attention=\"cudnn\" --set train.fp8=\"blocks\" --set train.loss_chunks=8 --set train.micro_batch_size=128"
  [cudnn-fp8-blocks-chunks8-b128-fast]="--set train.attention=\"cudnn\" --set train.fp8=\"blocks\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128"
  [cudnn-fp8-all-chunks8-b128]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.loss_chunks=8 --set train.micro_batch_size=128"
  [cudnn-fp8-all-chunks8-b128-fast]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128"
  [cudnn-fp8-all-chunks8-b256-fast]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256"
  [cudnn-fp8-blocks-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.fp8=\"blocks\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8-all-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8-head-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.fp8=\"lm_head\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8row-blocks-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.fp8=\"blocks\" --set train.fp8_scaling=\"row\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8row-all-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8row-all-chunks8-b128-tk-fast]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8row-all-chunks8-b128-tk-fast-mk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\" --set train.compile_multi_kernel=true"
  [cudnn-fp8row-all-chunks8-b128-tk8-fast-mk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true"
  [cudnn-fp8row-all-chunks8-b128-tk-fast-mk-gk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true"
  [cudnn-fp8row-all-chunks8-b128-tk8-fast-mk-gk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true"
  [cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true"
  [cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk-at]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true --set train.compile_mode=\"max-autotune-no-cudagraphs\""
  [cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk-cd]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true --set train.compile_tune_kernels=true"
  [plain-noprefetch]="--set train.batch_prefetch=false"
  [cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk-bf16res]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true --set train.residual_dtype=\"compute\""
  [cudnn-fp8row-all-chunks16-b256-tk8-fast-mk-gk-noprefetch]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.fp8_scaling=\"row\" --set train.fp8_fast_accum=true --set train.loss_chunks=16 --set train.micro_batch_size=256 --set train.loss_kernel=\"triton-e5m2\" --set train.compile_multi_kernel=true --set train.fp8_gelu_kernel=true --set train.batch_prefetch=false"
  [cudnn-chunks8-b128-tk]="--set train.attention=\"cudnn\" --set train.loss_chunks=8 --set train.micro_batch_size=128 --set train.loss_kernel=\"triton\""
  [cudnn-fp8-all-graphs]="--set train.attention=\"cudnn\" --set train.fp8=\"all\" --set train.compile_mode=\"max-autotune\""
)
names=("$@"); [ ${#names[@]} -eq 0 ] && names=(plain cudnn fp8-head fp8-all cudnn-fp8-head cudnn-fp8-all)
run_variant() {  # name gpu
  [ "$1" = _ ] && return
  [ -v "VARIANTS[$1]" ] || { echo "unknown variant $1 (known: ${!VARIANTS[*]})"; return; }
  local name=$1 start=$(date +%s); eval "local extra=(${VARIANTS[$1]})"
  CUDA_VISIBLE_DEVICES=$2 timeout ${VARIANT_TIMEOUT:-170} python3 src/scalelab/pretrain/train_gpt.py \
    --config configs/pretrain/gpt2-124m-fineweb-edu.toml --set "data.dir=\"$DATA\"" --set run.out_dir=\"/tmp/variants\" \
    --set run.name=\"$name\" --set run.gpu=\"h200\" --set train.max_steps=$STEPS --set train.val_every=0 \
    --set train.checkpoint_every=0 --set data.val_tokens=1048576 --set schedule.warmup_steps=5 \
    "${extra[@]}" > /tmp/variants-$name.log 2>&1
  echo "$name gpu=$2 exit=$? wall=$(( $(date +%s) - start ))s $(tail -1 /tmp/variants-$name.log)"
  rm -f /tmp/variants/$name/checkpoint.pt
  echo "$2" > /tmp/variants/$name/gpu 2>/dev/null
}
rm -rf /tmp/variants /tmp/variants-*.log  # this call's runs only, also on a machine still warm from the last
gpus=(${GPUS:-0}); i=0
for g in "${gpus[@]}"; do
  ( for ((j = i; j < ${#names[@]}; j += ${#gpus[@]})); do run_variant "${names[$j]}" "$g"; done ) &
  i=$((i + 1))
done
wait
tar czf $OUT/pretrain_variants.tgz -C /tmp variants $(cd /tmp && ls variants-*.log) 2>/dev/null
python3 - "$OUT/pretrain_variants.json" <<'PY'
import json, pathlib, sys
rows = {}
for p in sorted(pathlib.Path('/tmp/variants').glob('*/train_summary.json')):
    s, gpu = json.loads(p.read_text()), p.parent / "gpu"
    rows[p.parent.name] = {k: s[k] for k in ("tokens_per_s", "median_step_ms", "peak_memory_gib", "final_val_loss")}
    rows[p.parent.name]["gpu"] = int(gpu.read_text()) if gpu.is_file() else None
plains = {r["gpu"]: r["tokens_per_s"] for n, r in rows.items() if n in ("plain", "plain2")}  # one per GPU at most
print(f"{'variant':16s} {'tok/s':>10s} {'x plain':>8s} {'step ms':>9s} {'peak GiB':>9s} {'val loss':>9s}")
for name, r in rows.items():  # each against the plain run on its own GPU; else another GPU's, and said so
    same = r["gpu"] in plains
    base = plains.get(r["gpu"], next(iter(plains.values()), None))
    r["speedup_vs_plain"], r["plain_on_same_gpu"] = (r["tokens_per_s"] / base if base else None), same
    print(f"{name:16s} {r['tokens_per_s']:10,.0f} {r['speedup_vs_plain'] or float('nan'):8.3f} "
          f"{r['median_step_ms']:9.1f} {r['peak_memory_gib']:9.2f} {r['final_val_loss']:9.4f}")
pathlib.Path(sys.argv[1]).write_text(json.dumps(rows, indent=2) + "\n")
PY
