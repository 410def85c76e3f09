#!/usr/bin/env bash
# The test suite: unit tests, invariants and toy-scale integration (real trainers, torchrun on gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_vllm_cpu.sh
export SCALELAB_VLLM_PYTHON=$PWD/.venv-vllm/bin/python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} WANDB_MODE=offline WANDB_SILENT=true MPLBACKEND=Agg
# two workers (pytest-xdist), each file on one worker so its module fixtures are built once; most tests are
# single-threaded, so on 2 cores this halves the wall time. SCALELAB_TEST_WORKERS=0 runs everything in-process.
# xdist's reorder (files with most tests first) is off: tests/conftest.py puts the files with slow tests first.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${SCALELAB_TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder "$@"
