"""GPU only (skipped without CUDA; on the device: `WITH_TESTS=1 GPU_TESTS="-s
services/tts/tests/engine/test_oracle_clone_gpu.py" WITH_ENGINE=0 WITH_PEER=0 bash
bench/gpu.sh`): cloned (Base) and designed (VoiceDesign) voices, our engine vs the official
qwen-tts code at the released shapes, on CUDA, float32.

test_oracle_clone.py proves the same on CPU with tiny shapes; this file repeats it where
the engine serves: random `0.6b-base` and `1.7b-design` checkpoints written by our
`save_checkpoint` (the 1.7B one's weights stored in bf16 to halve the 9 GB of writing and
reading; both sides load them as float32, so they run the very same weights), the official
code run on them on CUDA in float32 (oracle_run.py in a subprocess: the device's one
Python, `lib.oracle_python`; librosa there is oracle_run.py's stand-in), our engine on
CUDA in float32 with `decoder_precision="fp32"`, eager and with CUDA graphs. TF32 is off in
both processes (`torch.backends.cuda.matmul` / `cudnn.allow_tf32`). Greedy. Checked:
- from reference audio (in-context: 4 s at 16 kHz, resampled on both sides; x-vector only:
  3 s at 24 kHz), our `make_voice_prompt` vs the official `create_voice_clone_prompt`: the
  x-vector within XVEC_MAX_REL, the reference codes equal (Mimi's RVQ picks each code by
  an argmin over float32 distances, and the two encoders' float32 latents differ in the
  last bits on a GPU: a near-tie may flip, and a flipped code changes the residual of the
  frame's later codebooks; at most REF_FRAMES_MAX_DIFF of the frames may differ, counted
  and printed);
- generated codes frame for frame, for a voice made of the official prompt (the official
  x-vector and reference codes: the generation alone is compared) and for our own prompt
  (end to end; asserted where our reference codes equal the official ones), in-context
  (streaming text) and x-vector only (offline), and VoiceDesign streaming and offline;
- the prompt (eager): our embedded prompt rows and decode-step text rows == the official
  talker's `inputs_embeds` and `trailing_text_hidden` within PROMPT_ATOL;
- audio SNR >= MIN_SNR_DB (ours streamed from a decoder state primed with the reference
  codes vs the official whole decode cut after the reference).
Each side is a few tens of frames (max_new_tokens 24-32): the random weights never reach
EOS, so the length cap stops both.

VOICE_CLONE_ORACLE_17B_BASE=1 adds `1.7b-base` (bf16-stored too) to the clone cases.
VOICE_CLONE_ORACLE_DEVICE=cpu runs this file on the CPU with tiny shapes (`tiny-base`,
`tiny-1.7b-design`, `tiny-1.7b-base`; no graphs): a check of this code path on a machine
without a GPU.
VOICE_ORACLE_LIBROSA_STANDIN=1 forces oracle_run.py's librosa stand-in where the real one
is installed.
"""

from __future__ import annotations

import gc
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from voice_tts.engine import Engine, EngineSettings
from voice_tts.engine.checkpoint import random_model, save_checkpoint
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.demo_tokenizer import write_demo_tokenizer
from voice_tts.engine.text import TextTokenizer, load_text_tokenizer
from voice_tts.engine.voices import VoicePrompt

from .lib import run_oracle, snr_db
from .test_oracle import MIN_SNR_DB
from .test_oracle_clone import INSTRUCT, LONG, Case, _ids, _our_prompt
from .test_oracle_clone import _generate as generate

DEVICE = os.environ.get("VOICE_CLONE_ORACLE_DEVICE", "cuda")
TINY = DEVICE == "cpu"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU"),
]
BASE = "tiny-base" if TINY else "0.6b-base"
DESIGN = "tiny-1.7b-design" if TINY else "1.7b-design"
# VOICE_CLONE_ORACLE_17B_BASE=1 adds the 1.7B Base (+2B random weights to write: ~1 min).
BASES = [BASE] + ([("tiny-" if TINY else "") + "1.7b-base"]
                  if os.environ.get("VOICE_CLONE_ORACLE_17B_BASE") == "1" else [])
STORE_BF16 = {n for n in (DESIGN, *BASES) if "1.7b" in n}  # loaded as float32 by both
MODES = ("eager",) if TINY else ("eager", "graphs")
XVEC_MAX_REL = 1e-4  # max |ours - official| / max |official|
REF_FRAMES_MAX_DIFF = 0.02  # fraction of reference frames whose codes may differ (ties)
PROMPT_ATOL = 1e-4
TEXT = "Hello there, streaming world."


class Clone:
    """A clone from reference audio: (id, rate, seconds, transcript, x-vector only,
    offline, max_new_tokens)."""

    def __init__(self, cid: str, rate: int, seconds: float, ref_text: str, xvec_only: bool,
                 offline: bool, max_new: int) -> None:
        self.id, self.rate, self.seconds, self.ref_text = cid, rate, seconds, ref_text
        self.xvec_only, self.offline, self.max_new = xvec_only, offline, max_new

    def audio(self) -> np.ndarray:
        """A voiced-like signal: a gliding tone with harmonics, a slow envelope, noise."""
        t = np.arange(int(self.seconds * self.rate)) / self.rate
        f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
        phase = 2 * np.pi * np.cumsum(f0) / self.rate
        wav = sum(0.2 / k * np.sin(k * phase) for k in (1, 2, 3, 5))
        wav *= 0.6 + 0.4 * np.sin(2 * np.pi * 0.9 * t) ** 2
        wav += 0.01 * np.random.default_rng(len(self.id)).standard_normal(len(t))
        return wav.astype(np.float32)

    def case(self, voice: str) -> Case:
        return Case(voice, BASE, TEXT, "english", offline=self.offline, max_new=self.max_new,
                    ref_text="" if self.xvec_only else self.ref_text)


CLONES = [Clone("icl_16k_stream", 16000, 4.0, "A short one.", False, False, 32),
          Clone("xvec_24k_offline", 24000, 3.0, "", True, True, 24)]
DESIGNS = [Case("design_stream", DESIGN, TEXT, "english", max_new=24, design=True),
           Case("design_offline", DESIGN, LONG, offline=True, max_new=16, design=True)]
TIMES: dict[str, float] = {}
# The 1.7B checkpoint is written on a thread while the 0.6B oracle runs (mostly on the GPU).
_WRITES: dict[str, Future] = {}
_POOL = ThreadPoolExecutor(1)


@pytest.fixture(scope="module", autouse=True)
def no_tf32():
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    print(f"\ntimes (s): {TIMES}")


def _cores() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1


def _write(name: str, root: Path) -> Path:
    t0 = time.perf_counter()
    torch.set_num_threads(_cores())  # on this (pool) thread
    model = random_model(ModelConfig.from_name(name), seed=5)
    if name in STORE_BF16:
        model.to(torch.bfloat16)
    path = save_checkpoint(model, root / name,
                           text_tokenizer_dir=write_demo_tokenizer(root / f"_tokenizer_{name}"))
    del model
    gc.collect()
    TIMES[f"write {name}"] = round(time.perf_counter() - t0, 1)
    return path


def _start_write(name: str, tmp_path_factory) -> Future:
    if name not in _WRITES:
        _WRITES[name] = _POOL.submit(_write, name, tmp_path_factory.mktemp("ckpt_gpu"))
    return _WRITES[name]


@pytest.fixture(scope="module", autouse=True)
def threads():
    """All cores for writing the random checkpoints (conftest sets 1, for the tiny models)."""
    n = torch.get_num_threads()
    torch.set_num_threads(_cores())
    yield
    torch.set_num_threads(n)
    _POOL.shutdown()


def _tokenizer(path: Path) -> TextTokenizer:
    cfg = ModelConfig.from_dir(path)
    return TextTokenizer(load_text_tokenizer(path), cfg.im_start_token_id, cfg.im_end_token_id)


def _oracle(name: str, path: Path, ids: dict, specs: list[dict], work: Path) -> dict:
    t0 = time.perf_counter()
    out = run_oracle({"device": DEVICE, "fast_init": True,
                      "runs": [{"checkpoint": str(path), "ids": ids, "cases": specs}]}, work)
    TIMES[f"oracle {name}"] = round(time.perf_counter() - t0, 1)
    TIMES[f"oracle {name} build"] = round(float(out["build_s_0"]), 1)
    for i in range(len(specs)):
        TIMES[f"oracle {name} case {i}"] = round(float(out[f"time_s_0_{i}"]), 1)
    print(f"\noracle {name}: qwen-tts-hf {out['version']}, librosa {out['librosa']}")
    return out


@pytest.fixture(scope="module", params=BASES)
def base(request, tmp_path_factory) -> tuple[Path, dict]:
    name = request.param
    path = _start_write(name, tmp_path_factory).result()
    nxt = BASES.index(name) + 1
    _start_write(BASES[nxt] if nxt < len(BASES) else DESIGN, tmp_path_factory)
    tok, ids, specs = _tokenizer(path), {}, []
    for c in CLONES:
        ids |= _ids(tok, c.case(c.id))
        specs.append({"mode": "clone", "text": TEXT, "language": "english",
                      "non_streaming_mode": c.offline, "max_new_tokens": c.max_new,
                      "ref_audio": c.audio().tolist(), "ref_sr": c.rate,
                      "ref_text": c.ref_text, "x_vector_only": c.xvec_only})
    return path, _oracle(name, path, ids, specs, tmp_path_factory.mktemp("oracle_base"))


@pytest.fixture(scope="module")
def design(tmp_path_factory) -> tuple[Path, dict]:
    t0 = time.perf_counter()
    path = _start_write(DESIGN, tmp_path_factory).result()
    TIMES[f"wait {DESIGN}"] = round(time.perf_counter() - t0, 1)
    tok, ids = _tokenizer(path), {}
    for c in DESIGNS:
        ids |= _ids(tok, c)
    specs = [{"mode": "design", "text": c.text, "speaker": "", "language": c.language,
              "instruct": INSTRUCT, "non_streaming_mode": c.offline,
              "max_new_tokens": c.max_new} for c in DESIGNS]
    return path, _oracle(DESIGN, path, ids, specs, tmp_path_factory.mktemp("oracle_design"))


def _engine(path: Path, mode: str) -> Engine:
    t0 = time.perf_counter()
    e = Engine.from_pretrained(path, device=DEVICE, dtype=torch.float32, settings=EngineSettings(
        max_sessions=4, max_batch=2, max_seq_len=512, cuda_graphs=mode == "graphs",
        decoder_precision="fp32"))
    TIMES[f"engine {path.name} {mode}"] = round(time.perf_counter() - t0, 1)
    return e


@pytest.fixture(scope="module", params=MODES)
def base_engine(request, base):
    e = _engine(base[0], request.param)
    yield request.param, e
    e.shutdown()
    del e
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.fixture(scope="module", params=MODES)
def design_engine(request, design):
    e = _engine(design[0], request.param)
    yield request.param, e
    e.shutdown()


def _generate(engine: Engine, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """test_oracle_clone's `_generate`, timed."""
    t0 = time.perf_counter()
    codes, audio = generate(engine, case)
    TIMES[f"ours {case.id}"] = round(time.perf_counter() - t0, 2)
    return codes, audio


def _check_prompt(engine: Engine, case: Case, oracle: dict, key: str) -> str:
    ref_prompt, ref_trailing = oracle[f"prompt_{key}"], oracle[f"trailing_{key}"]
    n = len(ref_trailing)
    prompt, trailing, track = _our_prompt(engine, case, n + 2)
    assert prompt.shape == ref_prompt.shape, (prompt.shape, ref_prompt.shape)
    np.testing.assert_allclose(prompt, ref_prompt, rtol=0, atol=PROMPT_ATOL)
    np.testing.assert_allclose(trailing[:n], ref_trailing, rtol=0, atol=PROMPT_ATOL)
    assert track[n:] == [engine.cfg.tts_pad_token_id] * 2, track
    diff = max(np.abs(prompt - ref_prompt).max(),
               np.abs(trailing[:n] - ref_trailing).max(initial=0))
    return f"prompt rows={len(prompt)} max diff {diff:.1e}"


def _check_generation(engine: Engine, case: Case, oracle: dict, key: str) -> str:
    codes, audio = _generate(engine, case)
    ref_codes, ref_audio = oracle[f"codes_{key}"], oracle[f"audio_{key}"]
    assert codes.shape == ref_codes.shape, (codes.shape, ref_codes.shape)
    differ = np.flatnonzero((codes != ref_codes).any(axis=1))
    assert not len(differ), (f"{len(differ)} of {len(codes)} frames differ, the first at "
                             f"frame {differ[0]} in codebooks "
                             f"{np.flatnonzero(codes[differ[0]] != ref_codes[differ[0]])}")
    # The official cut after the reference is a float product: at most one sample early.
    assert len(ref_audio) - len(audio) in (0, 1), (len(ref_audio), len(audio))
    ref_audio = ref_audio[len(ref_audio) - len(audio):]
    snr = snr_db(ref_audio, audio)
    assert snr >= MIN_SNR_DB, f"SNR {snr:.1f} dB"
    return (f"frames={len(codes)} equal, snr={snr:.1f}dB "
            f"max_abs={np.abs(ref_audio - audio).max():.1e}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("clone", CLONES, ids=[c.id for c in CLONES])
def test_clone_matches_official(clone, base, base_engine):
    mode, engine = base_engine
    oracle, key = base[1], f"0_{CLONES.index(clone)}"
    # Our prompt from the reference audio vs the official create_voice_clone_prompt.
    t0 = time.perf_counter()
    ours = engine.make_voice_prompt(clone.audio(), clone.rate, clone.ref_text,
                                    x_vector_only=clone.xvec_only)
    TIMES[f"ours prompt {clone.id} {mode}"] = round(time.perf_counter() - t0, 2)
    xvec = oracle[f"xvec_{key}"]
    assert ours.x_vector.shape == xvec.shape
    rel = float(np.abs(ours.x_vector - xvec).max() / np.abs(xvec).max())
    lines = [f"x-vector max rel diff {rel:.1e}"]
    assert rel <= XVEC_MAX_REL, rel
    ref_codes = None
    if clone.xvec_only:
        assert ours.ref_codes is None and f"refcode_{key}" not in oracle
    else:
        ref_codes = oracle[f"refcode_{key}"]
        assert ours.ref_codes.shape == ref_codes.shape, (ours.ref_codes.shape, ref_codes.shape)
        frames = int((ours.ref_codes != ref_codes).any(axis=1).sum())
        lines.append(f"reference frames {len(ref_codes)}, differing {frames} "
                     f"(codes {int((ours.ref_codes != ref_codes).sum())})")
        assert frames <= REF_FRAMES_MAX_DIFF * len(ref_codes), lines[-1]
    # Generation from the official prompt (the generation alone), then from ours.
    official = VoicePrompt(x_vector=xvec, ref_codes=ref_codes, ref_text=clone.ref_text)
    engine.add_voice(f"{clone.id}_official", official)
    case = clone.case(f"{clone.id}_official")
    if mode == "eager":
        lines.append(_check_prompt(engine, case, oracle, key))
    lines.append("official prompt: " + _check_generation(engine, case, oracle, key))
    same_prompt = ref_codes is None or np.array_equal(ours.ref_codes, ref_codes)
    engine.add_voice(f"{clone.id}_ours", ours)
    if same_prompt:
        lines.append("our prompt: " + _check_generation(engine, clone.case(f"{clone.id}_ours"),
                                                        oracle, key))
    print(f"\n{base[0].name} {mode} {clone.id}: " + "; ".join(lines))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", DESIGNS, ids=[c.id for c in DESIGNS])
def test_design_matches_official(case, design, design_engine):
    mode, engine = design_engine
    oracle, key = design[1], f"0_{DESIGNS.index(case)}"
    engine.add_voice(case.id, engine.design_voice_prompt(INSTRUCT))
    lines = [_check_prompt(engine, case, oracle, key)] if mode == "eager" else []
    lines.append(_check_generation(engine, case, oracle, key))
    print(f"\n{DESIGN} {mode} {case.id}: " + "; ".join(lines))
