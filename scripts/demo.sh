#!/usr/bin/env bash
# The offline CPU demo: prepare real text, predict, train a tiny GPT-2, export, report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/scalelab demo "$@"
