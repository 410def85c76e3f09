#!/usr/bin/env bash
# Copies the working tree (without .git, the virtual environments and the carried .gpu-* and .whl folders) to DEST
# and prints DEST. The GPU scripts' `launch` runs `work` from such a copy: the device machine's working tree is
# replaced by every later call, and a background job that imports from it while it is being replaced can find a
# module missing halfway through (a battery started just before the next call failed with ModuleNotFoundError).
#   bash bench/snapshot.sh DEST
set -euo pipefail
dest=${1:?usage: bash bench/snapshot.sh DEST}
rm -rf "$dest" && mkdir -p "$dest"
tar --exclude='./.gpu-*' --exclude=./.whl --exclude=./.git --exclude='./.venv*' -cf - . | tar -C "$dest" -xf -
echo "$dest"
