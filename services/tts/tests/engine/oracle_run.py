"""Run the OFFICIAL qwen-tts code on a checkpoint directory and dump codes + audio.

Runs under the oracle interpreter (`VOICE_ORACLE_PYTHON`, its own venv with qwen-tts-hf
and transformers 5), never under the engine's venv. Usage:

    python oracle_run.py spec.json out.npz

spec.json: {"runs": [{"checkpoint": dir, "ids": {prompt string: [ids]}, "cases":
[{"text", "speaker", "language", "instruct", "non_streaming_mode", "max_new_tokens"}]}]};
out.npz holds codes_<run>_<case>, audio_<run>_<case> and the package version. The processor
is a stand-in that returns the ids our tokenizer produced for each exact prompt string,
so both implementations see the same ids (see /work/shared/oracle/README.md). Weights are
loaded from the checkpoint files with strict name checking, so a naming mismatch between
our writer and the official modules fails here.
"""

import json
import os
import sys
import tempfile

import transformers.processing_utils  # noqa: F401  (before the stubs: see the oracle README)
from transformers import AutoProcessor  # noqa: F401

_stubs = tempfile.mkdtemp()
for _rel, _body in {"librosa/__init__.py": "from . import filters\n",
                    "librosa/filters.py": "def mel(*a, **k):\n    raise RuntimeError('stub')\n",
                    "sox.py": "", "soundfile.py": "", "gradio.py": "",
                    "torchaudio/__init__.py": "from . import compliance\n",
                    "torchaudio/compliance/__init__.py": "from . import kaldi\n",
                    "torchaudio/compliance/kaldi.py": ""}.items():
    os.makedirs(os.path.dirname(os.path.join(_stubs, _rel)), exist_ok=True)
    with open(os.path.join(_stubs, _rel), "w") as _f:
        _f.write(_body)
sys.path.append(_stubs)

from importlib.metadata import version  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import (  # noqa: E402
    Qwen3TTSForConditionalGeneration,
)
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Config,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Model,
)
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel  # noqa: E402
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


class IdsProcessor:
    def __init__(self, ids: dict[str, list[int]]) -> None:
        self.ids = ids

    def __call__(self, text, return_tensors="pt", padding=True):
        return {"input_ids": torch.tensor([self.ids[text]])}


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


def build(ckpt: str, ids: dict[str, list[int]]) -> Qwen3TTSModel:
    cfg = Qwen3TTSConfig(**read_json(os.path.join(ckpt, "config.json")))
    model = Qwen3TTSForConditionalGeneration(cfg).float().eval()
    model.load_state_dict(load_weights(ckpt), strict=True)
    st_dir = os.path.join(ckpt, "speech_tokenizer")
    st_cfg = Qwen3TTSTokenizerV2Config(**read_json(os.path.join(st_dir, "config.json")))
    if getattr(st_cfg.encoder_config, "rope_theta", None) is None:
        st_cfg.encoder_config.rope_theta = 10000.0
    st = Qwen3TTSTokenizer()
    st.model = Qwen3TTSTokenizerV2Model(st_cfg).float().eval()
    missing, unexpected = st.model.load_state_dict(load_weights(st_dir), strict=False)
    bad = [k for k in missing if not k.startswith("encoder.")] + list(unexpected)
    assert not bad, f"speech tokenizer weights do not match: {bad[:8]}"
    st.config, st.device = st.model.config, torch.device("cpu")
    model.load_speech_tokenizer(st)
    return Qwen3TTSModel(model=model, processor=IdsProcessor(ids), generate_defaults={})


def main() -> None:
    spec = read_json(sys.argv[1])
    out = {"version": np.array(version("qwen-tts-hf"))}
    for r, run in enumerate(spec["runs"]):
        run_cases(r, run, out)
    np.savez(sys.argv[2], **out)


def run_cases(r: int, run: dict, out: dict) -> None:
    torch.manual_seed(0)
    model = build(run["checkpoint"], run["ids"])
    captured: list[np.ndarray] = []
    decode = model.model.speech_tokenizer.decode

    def capture(items, *a, **k):
        captured.extend(np.asarray(it["audio_codes"].cpu()) for it in items)
        return decode(items, *a, **k)

    model.model.speech_tokenizer.decode = capture
    for i, case in enumerate(run["cases"]):
        captured.clear()
        wavs, sr = model.generate_custom_voice(
            text=case["text"], speaker=case["speaker"], language=case["language"],
            instruct=case.get("instruct") or None,
            non_streaming_mode=case["non_streaming_mode"], do_sample=False,
            subtalker_dosample=False, max_new_tokens=case["max_new_tokens"])
        out[f"codes_{r}_{i}"] = captured[0].astype(np.int64)
        out[f"audio_{r}_{i}"] = np.asarray(wavs[0], dtype=np.float32)
        out[f"sr_{r}_{i}"] = np.array(sr)


if __name__ == "__main__":
    main()
