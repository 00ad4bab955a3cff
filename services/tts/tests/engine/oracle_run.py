"""Run the OFFICIAL qwen-tts code on a checkpoint directory and dump codes + audio.

Runs under the oracle interpreter (`VOICE_ORACLE_PYTHON`, its own venv with qwen-tts-hf
and transformers 5), never under the engine's venv. Usage:

    python oracle_run.py spec.json out.npz

spec.json: {"device": "cpu" (default) or "cuda" (float32 there too, TF32 off), "fast_init":
false (true: modules built without their random init, all weights then loaded), "runs":
[{"checkpoint": dir, "ids": {prompt string: [ids]}, "cases":
[{"text", "speaker", "language", "instruct", "non_streaming_mode", "max_new_tokens"}]}]};
a case with "mode" "design" calls generate_voice_design (instruct = the description), one
with "clone" generate_voice_clone, from "x_vector" + "ref_code" (a prompt item made by us)
or from "ref_audio" + "ref_sr" (the official create_voice_clone_prompt), with "ref_text"
and "x_vector_only". out.npz holds codes_<run>_<case> (the generated frames: a clone's
reference codes cut off), audio_<run>_<case>, prompt_/trailing_<run>_<case> (the talker's
prompt embeddings and trailing text rows), for audio clones xvec_/refcode_<run>_<case>,
the package version, build / generate seconds, and the version of the librosa the official code
imported (the stand-in's: below). The processor
is a stand-in that returns the ids our tokenizer produced for each exact prompt string,
so both implementations see the same ids (see /work/shared/oracle/README.md). Weights are
loaded from the checkpoint files with strict name checking, so a naming mismatch between
our writer and the official modules fails here.
"""

import contextlib
import importlib.util
import os
import sys
import tempfile
import time

from oracle_env import install_stubs, load_weights, read_json

install_stubs()

# librosa: the official model imports it at module top and takes the speaker encoder's mel
# filter bank from `librosa.filters.mel`; `create_voice_clone_prompt` (and the speech
# tokenizer's encode) resample references with `librosa.resample`. Where librosa is not
# installed (the GPU host), or VOICE_ORACLE_LIBROSA_STANDIN=1 forces it, a stand-in serves
# those two calls from the engine's audio_features (loaded by file path: it needs only
# numpy, soxr and torch), whose `slaney_mel_filters` and `to_24k` test_speaker_encoder.py
# proves bit-equal to librosa 0.11's `filters.mel` and `resample` on CPU; anything else
# (`load`, other arguments) raises. Forced, it goes first on sys.path (the real librosa
# that transformers imported is dropped from sys.modules, so qwen_tts gets the stand-in);
# else last, used only where the real package is absent.
_STANDIN_INIT = '''"""librosa stand-in (see the test's oracle_run.py)."""
import importlib.util as _u
import os as _os

import numpy as _np

_spec = _u.spec_from_file_location("_voice_audio_features", _os.environ["VOICE_AUDIO_FEATURES"])
_af = _u.module_from_spec(_spec)
_spec.loader.exec_module(_af)
__version__ = "0.0+voice-standin"


def resample(y, *, orig_sr, target_sr, res_type="soxr_hq", fix=True, scale=False, axis=-1):
    if (int(target_sr) != _af.SAMPLE_RATE or res_type != "soxr_hq" or not fix or scale
            or _np.ndim(y) != 1):
        raise NotImplementedError("librosa stand-in: mono soxr_hq resampling to 24 kHz only")
    return _af.to_24k(y, int(orig_sr))


def load(*a, **k):
    raise NotImplementedError("librosa stand-in: no audio files")


from . import filters  # noqa: E402
'''
_STANDIN_FILTERS = '''import numpy as _np


def mel(*, sr, n_fft, n_mels=128, fmin=0.0, fmax=None, htk=False, norm="slaney",
        dtype=_np.float32):
    from . import _af

    if htk or norm != "slaney" or dtype != _np.float32:
        raise NotImplementedError("librosa stand-in: Slaney float32 filters only")
    fmax = float(sr) / 2 if fmax is None else float(fmax)
    return _af.slaney_mel_filters(int(sr), int(n_fft), int(n_mels), float(fmin), fmax).copy()
'''
LIBROSA_STANDIN = (os.environ.get("VOICE_ORACLE_LIBROSA_STANDIN") == "1"
                   or importlib.util.find_spec("librosa") is None)
if LIBROSA_STANDIN:
    os.environ["VOICE_AUDIO_FEATURES"] = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "voice_tts", "engine",
        "audio_features.py")
    _standin = tempfile.mkdtemp()
    os.makedirs(os.path.join(_standin, "librosa"))
    for _rel, _body in {"__init__.py": _STANDIN_INIT, "filters.py": _STANDIN_FILTERS}.items():
        with open(os.path.join(_standin, "librosa", _rel), "w") as _f:
            _f.write(_body)
    if importlib.util.find_spec("librosa") is not None:  # forced over the real one
        for _m in [m for m in sys.modules if m == "librosa" or m.startswith("librosa.")]:
            del sys.modules[_m]
        sys.path.insert(0, _standin)
    else:
        sys.path.append(_standin)

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
from qwen_tts.inference import qwen3_tts_model  # noqa: E402
from qwen_tts.inference.qwen3_tts_model import (  # noqa: E402
    Qwen3TTSModel,
    VoiceClonePromptItem,
)
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer  # noqa: E402


class IdsProcessor:
    def __init__(self, ids: dict[str, list[int]]) -> None:
        self.ids = ids

    def __call__(self, text, return_tensors="pt", padding=True):
        return {"input_ids": torch.tensor([self.ids[text]])}




def skip_init(fast: bool):
    """With `fast`, modules are built without their random init (every parameter is then
    loaded strictly from the checkpoint): a 1.7B model's CPU init takes tens of seconds."""
    if not fast:
        return contextlib.nullcontext()
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:  # the random init then: slower, same result
            return contextlib.nullcontext()
    return no_init_weights()


def build(ckpt: str, ids: dict[str, list[int]], device: str = "cpu",
          fast_init: bool = False) -> Qwen3TTSModel:
    """The official model on `device` in float32, weights from `ckpt` (any stored dtype:
    load_state_dict casts them to float32, as our loader does)."""
    cfg = Qwen3TTSConfig(**read_json(os.path.join(ckpt, "config.json")))
    with skip_init(fast_init):
        model = Qwen3TTSForConditionalGeneration(cfg).float().eval()
    model.load_state_dict(load_weights(ckpt), strict=True)
    model.to(device)
    base = cfg.tts_model_type == "base"
    st_dir = os.path.join(ckpt, "speech_tokenizer")
    st_cfg = Qwen3TTSTokenizerV2Config(**read_json(os.path.join(st_dir, "config.json")))
    if getattr(st_cfg.encoder_config, "rope_theta", None) is None:
        st_cfg.encoder_config.rope_theta = 10000.0
    st = Qwen3TTSTokenizer()
    with skip_init(fast_init):
        st.model = Qwen3TTSTokenizerV2Model(st_cfg).float().eval()
    missing, unexpected = st.model.load_state_dict(load_weights(st_dir), strict=False)
    bad = [k for k in missing if base or not k.startswith("encoder.")] + list(unexpected)
    assert not bad, f"speech tokenizer weights do not match: {bad[:8]}"
    st.model.to(device)
    st.config, st.device = st.model.config, torch.device(device)
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
    if spec.get("device", "cpu") != "cpu":  # plain float32, as our engine's comparison runs
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    out = {"version": np.array(version("qwen-tts-hf")),
           "librosa": np.array(qwen3_tts_model.librosa.__version__)}  # "...+voice-standin"
    for r, run in enumerate(spec["runs"]):
        run_cases(r, run, out, spec.get("device", "cpu"), spec.get("fast_init", False))
    np.savez(sys.argv[2], **out)


def run_cases(r: int, run: dict, out: dict, device: str = "cpu",
              fast_init: bool = False) -> None:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = build(run["checkpoint"], run["ids"], device, fast_init)
    out[f"build_s_{r}"] = np.array(time.perf_counter() - t0)
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
        t0 = time.perf_counter()
        wavs, sr, n_ref = generate(model, case, f"{r}_{i}", out)
        out[f"time_s_{r}_{i}"] = np.array(time.perf_counter() - t0)
        out[f"codes_{r}_{i}"] = captured[0][n_ref:].astype(np.int64)
        out[f"audio_{r}_{i}"] = np.asarray(wavs[0], dtype=np.float32)
        out[f"sr_{r}_{i}"] = np.array(sr)
        out[f"prompt_{r}_{i}"] = prompts[0][0][0].float().cpu().numpy()
        out[f"trailing_{r}_{i}"] = prompts[0][1][0].float().cpu().numpy()


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
        out[f"xvec_{key}"] = items[0].ref_spk_embedding.float().cpu().numpy()
        if items[0].ref_code is not None:
            out[f"refcode_{key}"] = np.asarray(items[0].ref_code.cpu(), dtype=np.int64)
        return items
    ref_code = None if xvec_only else torch.tensor(case["ref_code"], dtype=torch.long)
    return [VoiceClonePromptItem(
        ref_code=ref_code, ref_spk_embedding=torch.tensor(case["x_vector"], dtype=torch.float32),
        x_vector_only_mode=xvec_only, icl_mode=not xvec_only, ref_text=case.get("ref_text"))]


if __name__ == "__main__":
    main()
