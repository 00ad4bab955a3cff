"""Cloned (Base) and designed (VoiceDesign) voices: our engine vs the official qwen-tts code
on the same tiny random checkpoints (written by our `save_checkpoint`).

Greedy, CPU, float32, as test_oracle.py. Each case gives both sides the same voice: a clone
as an x-vector (+ reference codes and transcript for in-context cloning), the official
side as a `VoiceClonePromptItem`, ours as a library voice (`Engine.add_voice`); a design as
its description (the official `generate_voice_design` instruct). Checked per case:
- the prompt: our prompt rows (embedded) == the official talker's `inputs_embeds`, and our
  decode-step text track == its `trailing_text_hidden` (then tts_pad);
- the generated codes, frame for frame (the official decodes cat(reference codes, codes):
  its reference frames are cut off);
- the audio: ours streamed from a speech-decoder state primed with the reference codes vs
  the official decode cut after the reference (its float cut may keep one sample more:
  the last frames*1920 samples are compared), SNR >= 60 dB, max abs <= 1e-4.
In-context layouts covered: streaming with the text track shorter than the codec track
(Lx < Ly: all text in the prompt), longer (Lx > Ly: the rest trails, the prompt waits for
Ly - Lr target ids), a transcript longer than the reference codes (Lr > Ly: the decode
steps start in the transcript), and offline (non_streaming_mode).

`test_clone_from_audio_matches_official` goes end to end: reference audio (16 kHz
in-context streaming; 24 kHz x-vector only offline) -> our `make_voice_prompt` (x-vector,
reference codes) -> codes equal to the official `generate_voice_clone` from the same audio.
The Mimi encoder runs with full causal attention as the official loader sets it
(`restore_mimi_full_attention`); a 250-frame window would only differ for references over
10 s.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from voice_tts.engine import Engine, EngineSettings, SamplingParams, SessionParams
from voice_tts.engine.scheduler import Row
from voice_tts.engine.voices import VoicePrompt

from .lib import run_oracle, snr_db, write_tiny_checkpoint
from .test_oracle import MAX_ABS, MIN_SNR_DB, _pieces, _Sink

BASE, BASE_1B7, DESIGN = "tiny-base", "tiny-1.7b-base", "tiny-1.7b-design"
LONG = "Cloned voices speak the words of a much longer target sentence, word after word."
INSTRUCT = "A calm, low voice, speaking slowly."


class Case:
    def __init__(self, cid: str, config: str, text: str, language: str = "auto",
                 offline: bool = False, max_new: int = 24, ref_frames: int = 0,
                 ref_text: str = "", design: bool = False) -> None:
        self.id, self.config, self.text, self.language = cid, config, text, language
        self.offline, self.max_new, self.ref_frames, self.ref_text = (offline, max_new,
                                                                       ref_frames, ref_text)
        self.design = design

    def prompt(self, hidden: int) -> VoicePrompt:
        if self.design:
            return VoicePrompt(instruct=INSTRUCT)
        rng = np.random.default_rng(len(self.id))
        xvec = (0.5 * rng.standard_normal(hidden)).astype(np.float32)
        codes = (rng.integers(0, 2048, (self.ref_frames, 16)) if self.ref_frames else None)
        return VoicePrompt(x_vector=xvec, ref_codes=codes, ref_text=self.ref_text)


CASES = [
    # Lx = Lr + Lt + 1 = 9 + 7 + 1 < Ly = 41: the whole text in the prompt, then tts_pad.
    Case("icl_stream_short_text", BASE, "Hello there, streaming world.", "english",
         ref_frames=40, ref_text="A short one."),
    # Lx = 9 + ~50 + 1 > Ly = 13: the prompt takes 4 target ids, the rest trails.
    Case("icl_stream_long_text", BASE, LONG, max_new=32, ref_frames=12,
         ref_text="A short one."),
    # Lr = 16 > Ly = 7: the trailing text starts inside the transcript.
    Case("icl_stream_long_ref_text", BASE, "Hello there, streaming world.", ref_frames=6,
         ref_text="The reference says this."),
    Case("icl_offline", BASE, "Hello there, streaming world.", "english", offline=True,
         ref_frames=20, ref_text="A short one."),
    Case("xvec_stream", BASE, "Hello there, streaming world.", "english"),
    Case("xvec_offline", BASE, "Hello there, streaming world.", offline=True),
    # 1.7B-shaped (talker wider than the code predictor): the same in-context rows.
    Case("icl_stream_1b7", BASE_1B7, LONG, "english", max_new=32, ref_frames=16,
         ref_text="A short one."),
    Case("design_stream", DESIGN, "Hello there, streaming world.", "english", design=True),
    Case("design_offline", DESIGN, LONG, offline=True, max_new=20, design=True),
]
CONFIGS = (BASE, BASE_1B7, DESIGN)
# End to end from a reference recording: in-context at 16 kHz (resampled to 24 kHz on both
# sides), streaming; x-vector only at 24 kHz, offline. (id, rate, transcript, x-vector only)
E2E_TEXT = "Hello there, streaming world."
E2E = [("e2e_icl_16k", 16000, "A short one.", False), ("e2e_xvec_24k", 24000, "", True)]


def _reference_audio(rate: int) -> np.ndarray:
    """2.5 s of a voiced-like signal: a gliding tone with harmonics, plus a little noise."""
    t = np.arange(int(2.5 * rate)) / rate
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    wav = sum(0.2 / k * np.sin(k * phase) for k in (1, 2, 3, 5))
    wav += 0.01 * np.random.default_rng(7).standard_normal(len(t))
    return wav.astype(np.float32)


@pytest.fixture(scope="module")
def clone_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt_clone")
    return {name: write_tiny_checkpoint(name, root) for name in CONFIGS}


@pytest.fixture(scope="module")
def clone_engines(clone_checkpoints):
    engines = {name: Engine.from_pretrained(path, settings=EngineSettings(max_sessions=4))
               for name, path in clone_checkpoints.items()}
    for case in CASES:
        engine = engines[case.config]
        engine.add_voice(case.id, case.prompt(engine.cfg.talker.hidden_size))
    yield engines
    for engine in engines.values():
        engine.shutdown()


def _ids(tok, case: Case) -> dict[str, list[int]]:
    ids = {f"<|im_start|>assistant\n{case.text}<|im_end|>\n<|im_start|>assistant\n":
           tok.assistant_ids(case.text)}
    if case.ref_text:
        ids[f"<|im_start|>assistant\n{case.ref_text}<|im_end|>\n"] = tok.ref_prompt_ids(
            case.ref_text)
    if case.design:
        ids[f"<|im_start|>user\n{INSTRUCT}<|im_end|>\n"] = tok.instruct_ids(INSTRUCT)
    return ids


def _spec(case: Case, hidden: int) -> dict:
    spec = {"text": case.text, "speaker": "", "language": case.language,
            "non_streaming_mode": case.offline, "max_new_tokens": case.max_new}
    if case.design:
        return spec | {"mode": "design", "instruct": INSTRUCT}
    p = case.prompt(hidden)
    return spec | {"mode": "clone", "x_vector": p.x_vector.tolist(),
                   "x_vector_only": p.ref_codes is None, "ref_text": case.ref_text,
                   "ref_code": None if p.ref_codes is None else p.ref_codes.tolist()}


@pytest.fixture(scope="module")
def clone_oracle(clone_engines, clone_checkpoints, tmp_path_factory):
    runs = []
    for name in CONFIGS:
        engine, cases = clone_engines[name], [c for c in CASES if c.config == name]
        ids: dict[str, list[int]] = {}
        for c in cases:
            ids |= _ids(engine.tokenizer, c)
        specs = [_spec(c, engine.cfg.talker.hidden_size) for c in cases]
        for cid, rate, ref_text, xvec_only in E2E if name == BASE else ():  # last
            ids |= _ids(engine.tokenizer, Case(cid, BASE, E2E_TEXT, ref_text=ref_text))
            specs.append({"mode": "clone", "text": E2E_TEXT, "language": "english",
                          "non_streaming_mode": xvec_only, "max_new_tokens": 24,
                          "ref_audio": _reference_audio(rate).tolist(), "ref_sr": rate,
                          "ref_text": ref_text, "x_vector_only": xvec_only})
        runs.append({"checkpoint": str(clone_checkpoints[name]), "ids": ids,
                     "cases": specs})
    return run_oracle({"runs": runs}, tmp_path_factory.mktemp("oracle_clone"))


def _key(case: Case) -> str:
    r = CONFIGS.index(case.config)
    return f"{r}_{[c for c in CASES if c.config == case.config].index(case)}"


def _params(case: Case) -> SessionParams:
    return SessionParams(voice=case.id, language=case.language, seed=0,
                         sampling=SamplingParams.greedy(), non_streaming_mode=case.offline,
                         max_frames=case.max_new - 1)


@torch.no_grad()
def _our_prompt(engine: Engine, case: Case, steps: int
                ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Our prompt rows, embedded, and the text track of decode steps 1..steps (rows and
    ids), for the whole (flushed) text: exactly what the engine would prefill and feed."""
    from voice_tts.engine.runner import prompt_rows

    s = engine.open_session(_params(case), lambda ev: None)
    try:
        s.push_text(case.text)
        s.flush()
        row = Row(s, s.head())
        rows = prompt_rows(engine.cfg, engine.scheduler.prompt(row)[0])
        r = engine.runner
        ids = torch.tensor([[rows.text], [rows.codec]], device=r.device)
        prompt = r.embed_prompts(ids, r.extra_rows([rows], len(rows.text)))[0]
        text = row.utt.stream.ids()
        track = [engine.cfg.tts_pad_token_id] * steps if case.offline else [
            engine.scheduler._track_id(s, text, k) for k in range(1, steps + 1)]
        trailing = r.model.talker.text_embed(torch.tensor(track, device=r.device))
        return prompt.float().cpu().numpy(), trailing.float().cpu().numpy(), track
    finally:
        s.close()


def _generate(engine: Engine, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(codes, audio) of a greedy case: offline through `synthesize`, streaming as text
    pieces through a session."""
    if case.offline:
        audio, codes = engine.synthesize(case.text, case.id, case.language,
                                         sampling=SamplingParams.greedy(),
                                         non_streaming_mode=True,
                                         max_frames=case.max_new - 1, return_codes=True)
        return codes, audio
    return _stream(engine, case, seed=len(case.id))


def _stream(engine: Engine, case: Case, seed: int) -> tuple[np.ndarray, np.ndarray]:
    sink = _Sink()
    engine.start()
    s = engine.open_session(_params(case), sink)
    try:
        for piece in _pieces(case.text, random.Random(seed)):
            s.push_text(piece)
        s.flush()
        assert sink.done.wait(120), "no UtteranceEnd"
    finally:
        s.close()
    return (np.concatenate([p.codes for p in sink.packets]),
            np.concatenate([p.pcm for p in sink.packets]))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_official(case, clone_engines, clone_oracle):
    engine, key = clone_engines[case.config], _key(case)
    ref_prompt, ref_trailing = clone_oracle[f"prompt_{key}"], clone_oracle[f"trailing_{key}"]
    n = len(ref_trailing)  # the official rows, then tts_pad
    prompt, trailing, track = _our_prompt(engine, case, n + 2)
    assert prompt.shape == ref_prompt.shape, (prompt.shape, ref_prompt.shape)
    np.testing.assert_allclose(prompt, ref_prompt, rtol=0, atol=1e-6)
    np.testing.assert_allclose(trailing[:n], ref_trailing, rtol=0, atol=1e-6)
    assert track[n:] == [engine.cfg.tts_pad_token_id] * 2, track
    codes, audio = _generate(engine, case)
    ref_codes, ref_audio = clone_oracle[f"codes_{key}"], clone_oracle[f"audio_{key}"]
    assert codes.shape == ref_codes.shape, (codes.shape, ref_codes.shape)
    mismatched = int((codes != ref_codes).any(axis=1).sum())
    assert mismatched == 0, f"{mismatched} frames differ"
    # The official cut after the reference is a float product: at most one sample early.
    assert len(ref_audio) - len(audio) in (0, 1), (len(ref_audio), len(audio))
    ref_audio = ref_audio[len(ref_audio) - len(audio):]
    snr, max_abs = snr_db(ref_audio, audio), float(np.abs(ref_audio - audio).max())
    print(f"\n{case.config}/{case.id}: prompt rows={len(prompt)} frames={len(codes)} "
          f"mismatched=0 snr={snr:.1f}dB max_abs={max_abs:.2e}")
    assert snr >= MIN_SNR_DB
    assert max_abs <= MAX_ABS


@pytest.mark.timeout(900)
@pytest.mark.parametrize("e2e", E2E, ids=[e[0] for e in E2E])
def test_clone_from_audio_matches_official(e2e, clone_engines, clone_oracle):
    """Reference audio -> our make_voice_prompt -> the same x-vector, reference codes and
    generated codes as the official generate_voice_clone from that audio."""
    cid, rate, ref_text, xvec_only = e2e
    engine = clone_engines[BASE]
    key = f"0_{sum(c.config == BASE for c in CASES) + E2E.index(e2e)}"
    prompt = engine.make_voice_prompt(_reference_audio(rate), rate, ref_text,
                                      x_vector_only=xvec_only)
    xvec = clone_oracle[f"xvec_{key}"]
    np.testing.assert_allclose(prompt.x_vector, xvec, rtol=0, atol=1e-5)
    if xvec_only:
        assert prompt.ref_codes is None and f"refcode_{key}" not in clone_oracle
    else:
        assert np.array_equal(prompt.ref_codes, clone_oracle[f"refcode_{key}"])
    engine.add_voice(cid, prompt)
    case = Case(cid, BASE, E2E_TEXT, "english", offline=xvec_only, ref_text=ref_text)
    if case.offline:
        audio, codes = engine.synthesize(E2E_TEXT, cid, "english",
                                         sampling=SamplingParams.greedy(),
                                         non_streaming_mode=True, max_frames=case.max_new - 1,
                                         return_codes=True)
    else:
        codes, audio = _stream(engine, case, seed=3)
    ref_codes, ref_audio = clone_oracle[f"codes_{key}"], clone_oracle[f"audio_{key}"]
    assert codes.shape == ref_codes.shape and np.array_equal(codes, ref_codes)
    assert len(ref_audio) - len(audio) in (0, 1)
    snr = snr_db(ref_audio[len(ref_audio) - len(audio):], audio)
    print(f"\n{cid}: ref frames={0 if xvec_only else len(prompt.ref_codes)} "
          f"frames={len(codes)} snr={snr:.1f}dB "
          f"x-vector max diff={np.abs(prompt.x_vector - xvec).max():.1e}")
    assert snr >= MIN_SNR_DB
