"""Library voices in the engine: type rules, add/remove/list, resolution by name, the
in-context prompt's wait for text, and voice prompts made from audio (tiny random presets,
no oracle: test_oracle_clone.py compares with the official code)."""

from __future__ import annotations

import numpy as np
import pytest
from voice_tts.engine import Engine, EngineSettings, SamplingParams, SessionParams, UnknownVoice
from voice_tts.engine.engine_set import EngineSet
from voice_tts.engine.scheduler import Need
from voice_tts.engine.voices import VoicePrompt

RNG = np.random.default_rng(0)


def _clone(hidden: int, frames: int = 0, ref_text: str = "A short one.") -> VoicePrompt:
    return VoicePrompt(x_vector=RNG.standard_normal(hidden).astype(np.float32),
                       ref_codes=RNG.integers(0, 2048, (frames, 16)) if frames else None,
                       ref_text=ref_text if frames else "")


@pytest.fixture(scope="module")
def base() -> Engine:
    engine = Engine.from_preset("tiny-base", seed=0, settings=EngineSettings(max_sessions=4))
    yield engine
    engine.shutdown()


def test_type_rules() -> None:
    custom = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=1))
    assert custom.model_type == "custom_voice"
    assert {v.kind for v in custom.voices()} == {"preset"}
    with pytest.raises(ValueError, match="base checkpoint"):
        custom.make_voice_prompt(np.zeros(24000, np.float32), 24000, "hi")
    with pytest.raises(ValueError, match="voice_design"):
        custom.design_voice_prompt("A calm voice.")
    with pytest.raises(ValueError, match="needs a base"):
        custom.add_voice("mine", _clone(64))
    design = Engine.from_preset("tiny-1.7b-design", seed=0,
                                settings=EngineSettings(max_sessions=1))
    assert design.voices() == []  # no presets on Base / VoiceDesign
    with pytest.raises(ValueError, match="needs a base"):
        design.add_voice("mine", _clone(128))
    design.add_voice("calm", design.design_voice_prompt("A calm voice."))
    assert [(v.name, v.kind) for v in design.voices()] == [("calm", "design")]
    voice = design.voice_table.resolve("Calm", "english")
    assert voice.instruct_ids == design.tokenizer.instruct_ids("A calm voice.")
    assert voice.speaker_id is None and voice.speaker_vec is None


def test_add_remove_resolve(base: Engine) -> None:
    with pytest.raises(ValueError, match="needs a voice_design"):
        base.add_voice("d", VoicePrompt(instruct="A calm voice."))
    with pytest.raises(ValueError, match="x-vector of shape"):
        base.add_voice("bad", _clone(32))
    with pytest.raises(ValueError, match="reference codes"):
        base.add_voice("bad", VoicePrompt(x_vector=np.zeros(64, np.float32),
                                          ref_codes=np.full((4, 16), 5000), ref_text="x"))
    with pytest.raises(ValueError, match="transcript"):
        base.add_voice("bad", VoicePrompt(x_vector=np.zeros(64, np.float32),
                                          ref_codes=np.ones((4, 16), np.int64)))
    base.add_voice("Anna", _clone(64, frames=10))
    base.add_voice("xv", _clone(64))
    assert [(v.name, v.kind) for v in base.voices()] == [("anna", "clone"), ("xv", "clone")]
    voice = base.voice_table.resolve(" ANNA ", "auto")
    assert voice.icl is not None and voice.icl.codec_len == 11
    assert voice.icl.ref_ids == base.tokenizer.ref_ids("A short one.")
    assert base.voice_table.resolve("xv", "english").icl is None
    s = base.open_session(SessionParams(voice="xv", seed=0, sampling=SamplingParams.greedy(),
                                        max_frames=3), lambda ev: None)
    base.remove_voice("xv")
    with pytest.raises(UnknownVoice):
        base.open_session(SessionParams(voice="xv"), lambda ev: None)
    with pytest.raises(UnknownVoice):
        base.remove_voice("xv")
    s.close()
    # An open session keeps the voice it resolved.
    base.add_voice("xv2", _clone(64))
    s = base.open_session(SessionParams(voice="xv2", seed=0), lambda ev: None)
    base.remove_voice("xv2")
    s.push_text("Hello there.")
    s.flush()
    for _ in range(30):
        base.run_once()
    assert s.head() is None or s.head().steps > 0
    s.close()


def _need(engine: Engine, s) -> Need:
    utt = s.head()
    return engine.scheduler.need(s, utt, utt.stream.ids())


def test_in_context_prompt_waits_for_the_text_under_the_reference(base: Engine) -> None:
    """Ly = 13 codec rows over Lr reference ids: the prompt needs Ly - Lr text ids (or the
    flush); an x-vector clone starts from the first id, as a preset does."""
    base.add_voice("icl", _clone(64, frames=12))
    base.add_voice("xvec", _clone(64))
    need = 13 - len(base.tokenizer.ref_ids("A short one."))
    icl = base.open_session(SessionParams(voice="icl", seed=0), lambda ev: None)
    xvec = base.open_session(SessionParams(voice="xvec", seed=0), lambda ev: None)
    try:
        words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
        for i, w in enumerate(words):
            for s in (icl, xvec):
                s.push_text(w + " ")
            n = len(icl.head().stream.ids().text)
            assert _need(base, xvec) is Need.PREFILL
            assert _need(base, icl) is (Need.PREFILL if n >= need else Need.NOTHING), (i, n)
        assert n >= need
        short = base.open_session(SessionParams(voice="icl", seed=0), lambda ev: None)
        short.push_text("Hi")
        assert _need(base, short) is Need.NOTHING
        short.flush()
        assert _need(base, short) is Need.PREFILL  # flushed: eos and tts_pad fill the rows
        short.close()
    finally:
        icl.close()
        xvec.close()


def test_make_voice_prompt_from_audio(base: Engine) -> None:
    t = np.arange(48000 * 2) / 48000
    stereo = np.stack([0.3 * np.sin(2 * np.pi * 150 * t), 0.2 * np.sin(2 * np.pi * 230 * t)],
                      axis=-1).astype(np.float32)
    p = base.make_voice_prompt(stereo, 48000, "Two seconds of tones.")
    assert p.x_vector.shape == (64,) and p.x_vector.dtype == np.float32
    assert p.ref_codes.shape == (25, 16)  # 2 s at 12.5 Hz
    assert p.ref_text == "Two seconds of tones."
    assert base.make_voice_prompt(stereo, 48000, "text", x_vector_only=True).ref_codes is None
    assert base.make_voice_prompt(stereo, 48000, "  ").ref_codes is None
    np.testing.assert_array_equal(base.make_voice_prompt(stereo, 48000).x_vector, p.x_vector)
    base.add_voice("tones", p)
    audio = base.synthesize("Hello there.", "tones", sampling=SamplingParams.greedy(),
                            max_frames=4)
    assert len(audio) % base.frame_samples == 0 and len(audio) > 0


def test_an_engine_set_speaks_presets_clones_and_designs() -> None:
    """The stack's TTS (`TTS_MODEL=a,b,c`): a CustomVoice, a Base and a VoiceDesign engine
    as one; each voice goes to the engine that owns it, one name is one voice."""
    es = EngineSet([Engine.from_preset(n, seed=0, settings=EngineSettings(max_sessions=2))
                    for n in ("tiny", "tiny-base", "tiny-1.7b-design")])
    try:
        assert es.can_clone and es.maker_for("design").model_type == "voice_design"
        t = np.arange(24000 * 3) / 24000
        clone = es.make_voice_prompt((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32),
                                     24000, "Three seconds of a tone.")
        es.add_voice("alice", clone)
        es.add_voice("calm", es.design_voice_prompt("A calm voice."))
        with pytest.raises(ValueError, match="already a voice of preset:tiny"):
            es.add_voice("Vivian", clone)
        assert {("vivian", "preset"), ("alice", "clone"), ("calm", "design")} <= {
            (v.name, v.kind) for v in es.voices()}
        owners = {name: es.voice_table.owner(name).model_type
                  for name in ("vivian", "alice", "calm")}
        assert owners == {"vivian": "custom_voice", "alice": "base", "calm": "voice_design"}
        for voice in ("vivian", "alice", "calm"):
            engine = es.voice_table.owner(voice)
            audio = engine.synthesize("Hello there.", voice, sampling=SamplingParams.greedy(),
                                      max_frames=3)
            assert len(audio) == 3 * es.frame_samples
        es.remove_voice("alice")
        with pytest.raises(UnknownVoice):
            es.voice_table.names("alice", "auto")
    finally:
        es.shutdown()
    assert not Engine.from_preset("tiny", seed=0,
                                  settings=EngineSettings(max_sessions=1)).can_clone


def test_decoder_priming_is_decoded_once_then_copied(base: Engine) -> None:
    """The first utterance of an in-context voice decodes its reference codes into the
    speech decoder state and keeps that state; later ones copy it in: same audio."""
    base.add_voice("primed", _clone(64, frames=30))
    icl = base.voice_table.resolve("primed", "auto").icl
    assert not icl.decoder_state

    def say() -> np.ndarray:
        return base.synthesize("Hello there.", "primed", sampling=SamplingParams.greedy(),
                               max_frames=6)

    first = say()
    assert icl.decoder_state
    np.testing.assert_array_equal(say(), first)
