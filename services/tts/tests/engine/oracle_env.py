"""What the oracle scripts (oracle_run.py, oracle_speaker.py, oracle_speech_encoder.py)
share: the official package's import-time stand-ins and the checkpoint readers. Imported
by those scripts under the oracle interpreter (their directory is first on sys.path)."""

import json
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file


def install_stubs() -> None:
    """Importing qwen_tts pulls in the 25 Hz tokenizer and the demo (torchaudio, sox,
    soundfile, gradio), which the 12 Hz path never calls: empty stand-ins at the END of
    sys.path, used only where the real package is absent. transformers' processing utils
    are imported first: if transformers saw a stand-in there, it would import soxr."""
    import transformers.processing_utils  # noqa: F401
    from transformers import AutoProcessor  # noqa: F401

    stubs = tempfile.mkdtemp()
    for rel, body in {"sox.py": "", "soundfile.py": "", "gradio.py": "",
                      "torchaudio/__init__.py": "from . import compliance\n",
                      "torchaudio/compliance/__init__.py": "from . import kaldi\n",
                      "torchaudio/compliance/kaldi.py": ""}.items():
        os.makedirs(os.path.dirname(os.path.join(stubs, rel)), exist_ok=True)
        with open(os.path.join(stubs, rel), "w") as f:
            f.write(body)
    sys.path.append(stubs)


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def load_weights(directory: str) -> dict[str, torch.Tensor]:
    """A checkpoint directory's tensors (one model.safetensors or its shards)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        out = {}
        for f in sorted(set(read_json(index)["weight_map"].values())):
            out.update(load_file(os.path.join(directory, f)))
        return out
    return load_file(os.path.join(directory, "model.safetensors"))
