#!/usr/bin/env bash
# A site-packages bundle of SGLang for the H200 image (CPython 3.12, torch 2.11.0+cu130, glibc 2.39, no package
# index), to be used beside the vLLM bundle (../shared/gpu/vllm-bundle), which already carries fastapi, uvicorn,
# pydantic, pyzmq, msgspec, openai and the other server packages both engines import.
#   bash bench/sglang_bundle.sh build [OUTDIR]     here (PyPI): download, trim to sm_90, xz, split into 46 MiB parts
#   bash bench/sglang_bundle.sh unpack [DIR]       there: check the parts' sha256 and unpack into /tmp/sglang-site
#   bash bench/sglang_bundle.sh probe OUT.json     there: every module the server's import chain still lacks
#                                                  (bench/import_probe.py), then the real import without stand-ins
# Why this release: bench/sglang_compat.py (results/cpu/sglang_compat.json) finds SGLang 0.5.11-0.5.17 pinning the
# image's torch 2.11.0 with kernels linked to CUDA 13; 0.5.17 is the newest of them. It pins transformers 5.12.1,
# not the image's 5.17: the bundle carries it, first on the SGLang server's PYTHONPATH only.
# Trimmed: sglang-kernel's non-sm_90 GPU code is zeroed (the vLLM bundle's prune_fatbin.py) so it compresses, and
# its sm_100 build and its flashmla (MLA attention), infllm and spatial extensions are left out: a dense text model
# on an H200 uses FA3 and the sm_90 kernels. flashinfer's own dependencies (cutlass-dsl, cudnn-frontend, cuda-tile,
# nccl4py; hundreds of MB) are not carried: start the server with --attention-backend fa3 --sampling-backend
# pytorch, so flashinfer is imported but no kernel of it runs; `probe` says whether that holds.
set -euo pipefail
SGLANG=0.5.17 KERNEL=0.4.5 FLASHINFER=0.6.15.post1 TRANSFORMERS=5.12.1
# pure-Python or manylinux wheels SGLang's server imports that neither the image nor the vLLM bundle has; the
# first GPU probe's list is the check, EXTRA_WHEELS adds what it names
DEPS="apache-tvm-ffi==0.1.11 xgrammar==0.2.1 torch_memory_saver==0.0.10 torchao==0.17.0 orjson==3.13.0
  uvloop==0.23.0 interegular==0.3.3 einops==0.8.2 xxhash==4.1.0 zstandard==0.25.0 sentencepiece==0.2.3
  nvidia-ml-py==13.615.71 cuda-python==13.4.4 cuda-bindings==13.4.4 cuda-core==1.2.0 cuda-pathfinder==1.9.1
  compressed-tensors==0.20.1
  loguru==0.7.3 psutil==7.2.2 ninja==1.13.0 click==8.3.1 tabulate==0.9.0
  dill==0.4.0 gguf==0.19.0 tokenizers==0.22.1
  jsonschema==4.25.1 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.28.0 attrs==25.4.0
  soundfile==0.13.1 cffi==2.0.0 pycparser==2.23
  ipython==9.6.0 ipython_pygments_lexers==1.1.1 decorator==5.3.2 jedi==0.20.1 parso==0.8.7 matplotlib_inline==0.2.2
  pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.5 pygments==2.21.0 stack_data==0.6.3
  asttokens==3.0.2 executing==2.3.0 pure_eval==0.2.4 traitlets==5.16.1"
# Found missing on the H100 image (2026-12-06), one real import at a time: IPython (sglang.utils), dill (custom
# logit processors), gguf, jsonschema, soundfile; and transformers 5.12.1 refuses the image's tokenizers 0.23.2
# (it wants <= 0.23.0), so the bundle carries tokenizers 0.22.1 ahead of it.
PRUNE=${PRUNE:-../shared/gpu/vllm-bundle/prune_fatbin.py}
DEST=${DEST:-/tmp/sglang-site}

wheel_args() {  # the image's CPython and every manylinux tag its glibc 2.39 accepts
  local n a="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
  for n in $(seq 17 39); do a="$a --platform manylinux_2_${n}_x86_64"; done
  echo "$a --platform manylinux2014_x86_64 --platform any"
}

build() {
  local out=${1:-$PWD/.gpu-sglang} w=/tmp/sglang-bundle-build
  rm -rf "$w" && mkdir -p "$w/wh" "$w/site" "$out"
  # shellcheck disable=SC2046  # the option list splits into words on purpose
  python3 -m pip download -q --no-deps $(wheel_args) -d "$w/wh" "sglang==$SGLANG" "sglang-kernel==$KERNEL" \
    "flashinfer_python==$FLASHINFER" "transformers==$TRANSFORMERS" $DEPS ${EXTRA_WHEELS:-}
  (cd "$w/site" && for f in "$w"/wh/*.whl; do unzip -q -o "$f"; done)
  local k=$w/site/sgl_kernel
  rm -rf "$k/sm100" "$k/flashmla_ops.abi3.so" "$k/infllm_ops."*.so "$k/spatial_ops.abi3.so"
  local so; for so in "$k/flash_ops.abi3.so" "$k/sm90/common_ops.abi3.so"; do python3 "$PRUNE" "$so" "$so"; done
  (cd "$w" && tar -cf - site | xz -9 -T2 > sglang-bundle.tar.xz)
  rm -f "$out"/sglang-bundle.tar.xz.*
  split -b 46m -d -a 1 "$w/sglang-bundle.tar.xz" "$out/sglang-bundle.tar.xz."
  cp "$0" bench/import_probe.py "$out/"
  (cd "$out" && sha256sum sglang-bundle.tar.xz.? > SHA256SUMS && ls -l)
}

unpack() {
  local src=${1:-$(dirname "$(readlink -f "$0")")}
  (cd "$src" && sha256sum -c --quiet SHA256SUMS)
  rm -rf "$DEST" && mkdir -p "$DEST"
  cat "$src"/sglang-bundle.tar.xz.* | xz -dc -T0 | tar -x -C "$DEST"
  echo "unpacked: $(du -sh "$DEST" | cut -f1) in $DEST/site"
}

probe() {  # the SGLang site first (its transformers pin), then the vLLM bundle's server packages
  local out=${1:?usage: bash bench/sglang_bundle.sh probe OUT.json} here
  here=$(dirname "$(readlink -f "$0")")
  export PYTHONPATH=$DEST/site:/tmp/vllm-site/site
  python3 "$here/import_probe.py" sgl_kernel sglang.srt.entrypoints.http_server sglang.launch_server --out "$out"
  python3 -c "import sgl_kernel, sglang.srt.entrypoints.http_server as h; print('import ok', h.__name__)"
}

case ${1:-} in
  build) build "${2:-}" ;;
  unpack) unpack "${2:-}" ;;
  probe) probe "${2:-}" ;;
  *) echo "usage: bash bench/sglang_bundle.sh build [OUTDIR] | unpack [DIR] | probe OUT.json" >&2; exit 2 ;;
esac
