"""Run the OFFICIAL qwen-tts code on a checkpoint directory and dump codes + audio.

Runs under the oracle interpreter (`VOICE_ORACLE_PYTHON`, its own venv with qwen-tts-hf
and transformers 5), never under the engine's venv. Usage:

    python oracle_run.py spec.json out.npz

spec.json: {"runs": [{"checkpoint": dir, "ids": {prompt string: [ids]}, "cases":
[{"text", "speaker", "language", "instruct", "non_streaming_mode", "max_new_tokens"}]}]};
a case with "mode" "design" calls generate_voice_design (instruct = the description), one
with "clone" generate_voice_clone, from "x_vector" + "ref_code" (a prompt item made by us)
or from "ref_audio" + "ref_sr" (the official create_voice_clone_prompt), with "ref_text"
and "x_vector_only". out.npz holds codes_<run>_<case> (the generated frames: a clone's
reference codes cut off), audio_<run>_<case>, prompt_/trailing_<run>_<case> (the talker's
prompt embeddings and trailing text rows), for audio clones xvec_/refcode_<run>_<case>,
and the package version. The processor
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
from qwen_tts.inference.qwen3_tts_model import (  # noqa: E402
    Qwen3TTSModel,
    VoiceClonePromptItem,
)
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
    base = cfg.tts_model_type == "base"
    st_dir = os.path.join(ckpt, "speech_tokenizer")
    st_cfg = Qwen3TTSTokenizerV2Config(**read_json(os.path.join(st_dir, "config.json")))
    if getattr(st_cfg.encoder_config, "rope_theta", None) is None:
        st_cfg.encoder_config.rope_theta = 10000.0
    st = Qwen3TTSTokenizer()
    st.model = Qwen3TTSTokenizerV2Model(st_cfg).float().eval()
    missing, unexpected = st.model.load_state_dict(load_weights(st_dir), strict=False)
    bad = [k for k in missing if base or not k.startswith("encoder.")] + list(unexpected)
    assert not bad, f"speech tokenizer weights do not match: {bad[:8]}"
    st.config, st.device = st.model.config, torch.device("cpu")
    if base:  # what Qwen3TTSTokenizer.from_pretrained sets up for encode()
        from qwen_tts._transformers_compat import restore_mimi_full_attention
        from transformers import EncodecFeatureExtractor

        st.feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000,
                                                       padding_value=0.0)
        restore_mimi_full_attention(st.model)
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
    prompts: list[tuple[torch.Tensor, torch.Tensor]] = []
    decode = model.model.speech_tokenizer.decode
    talker_generate = model.model.talker.generate

    def capture(items, *a, **k):
        captured.extend(np.asarray(it["audio_codes"].cpu()) for it in items)
        return decode(items, *a, **k)

    def capture_prompt(*a, **k):
        prompts.append((k["inputs_embeds"], k["trailing_text_hidden"]))
        return talker_generate(*a, **k)

    model.model.speech_tokenizer.decode = capture
    model.model.talker.generate = capture_prompt
    for i, case in enumerate(run["cases"]):
        captured.clear()
        prompts.clear()
        wavs, sr, n_ref = generate(model, case, f"{r}_{i}", out)
        out[f"codes_{r}_{i}"] = captured[0][n_ref:].astype(np.int64)
        out[f"audio_{r}_{i}"] = np.asarray(wavs[0], dtype=np.float32)
        out[f"sr_{r}_{i}"] = np.array(sr)
        out[f"prompt_{r}_{i}"] = prompts[0][0][0].float().numpy()
        out[f"trailing_{r}_{i}"] = prompts[0][1][0].float().numpy()


def generate(model: Qwen3TTSModel, case: dict, key: str, out: dict):
    """The official generate of a case, greedy -> (wavs, sample rate, reference frames
    at the head of the decoded codes)."""
    kw = dict(non_streaming_mode=case["non_streaming_mode"], do_sample=False,
              subtalker_dosample=False, max_new_tokens=case["max_new_tokens"])
    mode = case.get("mode", "custom")
    if mode == "design":
        wavs, sr = model.generate_voice_design(text=case["text"], instruct=case["instruct"],
                                               language=case["language"], **kw)
        return wavs, sr, 0
    if mode == "clone":
        items = clone_prompt(model, case, key, out)
        wavs, sr = model.generate_voice_clone(text=case["text"], language=case["language"],
                                              voice_clone_prompt=items, **kw)
        ref = items[0].ref_code
        return wavs, sr, 0 if ref is None else len(ref)
    wavs, sr = model.generate_custom_voice(
        text=case["text"], speaker=case["speaker"], language=case["language"],
        instruct=case.get("instruct") or None, **kw)
    return wavs, sr, 0


def clone_prompt(model: Qwen3TTSModel, case: dict, key: str, out: dict) -> list:
    xvec_only = bool(case.get("x_vector_only"))
    if "ref_audio" in case:
        items = model.create_voice_clone_prompt(
            ref_audio=(np.asarray(case["ref_audio"], dtype=np.float32), case["ref_sr"]),
            ref_text=case.get("ref_text") or None, x_vector_only_mode=xvec_only)
        out[f"xvec_{key}"] = items[0].ref_spk_embedding.float().numpy()
        if items[0].ref_code is not None:
            out[f"refcode_{key}"] = np.asarray(items[0].ref_code, dtype=np.int64)
        return items
    ref_code = None if xvec_only else torch.tensor(case["ref_code"], dtype=torch.long)
    return [VoiceClonePromptItem(
        ref_code=ref_code, ref_spk_embedding=torch.tensor(case["x_vector"], dtype=torch.float32),
        x_vector_only_mode=xvec_only, icl_mode=not xvec_only, ref_text=case.get("ref_text"))]


if __name__ == "__main__":
    main()
