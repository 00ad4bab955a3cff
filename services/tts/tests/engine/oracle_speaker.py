"""Run the OFFICIAL speaker-encoder path (mel, x-vector) on a Base checkpoint directory.

Runs under the oracle interpreter (see oracle_run.py). Usage:

    python oracle_speaker.py spec.json out.npz

spec.json: {"checkpoint": dir, "inputs": path of an .npz with wav_<name> (float32 mono)
and sr_<name>}. For each name, out.npz holds wav24k_<name> (the reference at 24 kHz:
`librosa.resample` as `create_voice_clone_prompt` does, W 440-444), mel_<name> (the
official `mel_spectrogram` with `extract_speaker_embedding`'s arguments, (1, T, 128)) and
xvec_<name> (`extract_speaker_embedding`, float32). The model is built from config.json
and loaded with strict name checking, so our writer's `speaker_encoder.*` names are checked.
"""

import json
import os
import sys
import tempfile

import transformers.processing_utils  # noqa: F401  (before the stubs: see the oracle README)

# Importing qwen_tts pulls in the 25 Hz tokenizer and the demo (torchaudio, sox, gradio):
# empty stand-ins at the END of sys.path, used only where the real package is absent.
_stubs = tempfile.mkdtemp()
for _rel, _body in {"sox.py": "", "gradio.py": "",
                    "torchaudio/__init__.py": "from . import compliance\n",
                    "torchaudio/compliance/__init__.py": "from . import kaldi\n",
                    "torchaudio/compliance/kaldi.py": ""}.items():
    os.makedirs(os.path.dirname(os.path.join(_stubs, _rel)), exist_ok=True)
    with open(os.path.join(_stubs, _rel), "w") as _f:
        _f.write(_body)
sys.path.append(_stubs)

import librosa  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import (  # noqa: E402
    Qwen3TTSForConditionalGeneration,
    mel_spectrogram,
)
from safetensors.torch import load_file  # noqa: E402


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def load_weights(directory: str) -> dict[str, torch.Tensor]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        out = {}
        for f in sorted(set(read_json(index)["weight_map"].values())):
            out.update(load_file(os.path.join(directory, f)))
        return out
    return load_file(os.path.join(directory, "model.safetensors"))


def main() -> None:
    spec = read_json(sys.argv[1])
    ckpt = spec["checkpoint"]
    cfg = Qwen3TTSConfig(**read_json(os.path.join(ckpt, "config.json")))
    assert cfg.tts_model_type == "base", cfg.tts_model_type
    model = Qwen3TTSForConditionalGeneration(cfg).float().eval()
    model.load_state_dict(load_weights(ckpt), strict=True)
    target = model.speaker_encoder_sample_rate
    out = {}
    with np.load(spec["inputs"]) as data:
        names = [k[len("wav_"):] for k in data.files if k.startswith("wav_")]
        for name in names:
            wav, sr = data[f"wav_{name}"], int(data[f"sr_{name}"])
            if sr != target:  # W 441-444, verbatim
                wav = librosa.resample(y=wav.astype(np.float32), orig_sr=int(sr),
                                       target_sr=target)
            mel = mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=128,
                                  sampling_rate=24000, hop_size=256, win_size=1024, fmin=0,
                                  fmax=12000).transpose(1, 2)
            xvec = model.extract_speaker_embedding(audio=wav, sr=target)
            out[f"wav24k_{name}"] = wav
            out[f"mel_{name}"] = mel.numpy()
            out[f"xvec_{name}"] = xvec.float().numpy()
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
