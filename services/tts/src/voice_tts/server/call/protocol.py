"""Every protocol rule of `voice.tts.v1.TextToSpeech` that is not streaming: SessionConfig
validation and defaults, on the call's own `SessionConfig` (`messages.py`: each front
parses its wire into it).

Errors are raised as `CallError(kind, message)` (`errors.py` maps kinds to every
protocol's status). Messages say what to fix, never echo more than a short prefix of input.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from voice_tts.engine import EngineSettings, SamplingParams, UnknownVoice
from voice_tts.server.call.messages import ResolvedConfig, Sampling, SessionConfig
from voice_tts.server.errors import CallError, invalid
from voice_tts.settings import SUPPORTED_FRAME_MS, SUPPORTED_RATES

MAX_INSTRUCT_CHARS = 1000
MAX_ID_CHARS = 128  # session_id, trace_id: they go into every log line of the call
MAX_FRAMES_PER_MESSAGE = 16
# A client's frame cap per utterance may lower the engine's, not raise it (2047 codec
# frames, 164 s: past it a request could hold an engine slot for minutes).
MAX_UTTERANCE_FRAMES = EngineSettings.max_frames
ENCODINGS = ("", "pcm_s16le")  # "": the default, PCM s16le


# Seconds a client turned away (capacity, draining) is told to wait before retrying.
RETRY_AFTER_S = 1


def _sampling(p: Sampling) -> SamplingParams:
    """The proto's fields set the talker and the code predictor (the official
    `subtalker_*` settings) alike; repetition_penalty is the talker's only."""
    kw: dict[str, object] = {}
    if p.greedy is not None:
        kw["do_sample"] = kw["subtalker_do_sample"] = not p.greedy
    if p.temperature is not None:
        if not 0.0 < p.temperature <= 2.0:
            raise invalid(f"sampling.temperature must be in (0, 2], got {p.temperature}")
        kw["temperature"] = kw["subtalker_temperature"] = p.temperature
    if p.top_k is not None:
        if p.top_k > 4096:
            raise invalid(f"sampling.top_k must be 0 (off) .. 4096, got {p.top_k}")
        kw["top_k"] = kw["subtalker_top_k"] = p.top_k
    if p.top_p is not None:
        if not 0.0 < p.top_p <= 1.0:
            raise invalid(f"sampling.top_p must be in (0, 1], got {p.top_p}")
        kw["top_p"] = kw["subtalker_top_p"] = p.top_p
    if p.repetition_penalty is not None:
        if not 1.0 <= p.repetition_penalty <= 2.0:
            raise invalid(
                f"sampling.repetition_penalty must be in [1, 2], got {p.repetition_penalty}"
            )
        kw["repetition_penalty"] = p.repetition_penalty
    return SamplingParams(**kw)  # type: ignore[arg-type]


def _check_id(name: str, value: str) -> None:
    # Bounded and printable: the ids are logged verbatim (no unbounded or forged lines).
    if len(value) > MAX_ID_CHARS:
        raise invalid(f"SessionConfig.{name} is {len(value)} characters; the limit is "
                      f"{MAX_ID_CHARS}")
    if not value.isprintable():
        raise invalid(f"SessionConfig.{name} holds control characters; use printable text")


def resolve_config(
    cfg: SessionConfig, voice_names: Callable[[str, str], tuple[str, str]]
) -> ResolvedConfig:
    """Validates a SessionConfig and fills its defaults.

    `voice_names(voice, language)`: the engine's one rule for both (`voices.VoiceNames`):
    their spelling, or UnknownVoice (NOT_FOUND, naming the known ones).
    """
    if not cfg.voice:
        raise invalid("SessionConfig.voice is required (or SessionConfig.reference, inline "
                      "reference audio); ListVoices names the voices")
    try:
        voice, language = voice_names(cfg.voice, cfg.language)
    except UnknownVoice as e:
        raise CallError("not_found", str(e)) from None
    if len(cfg.instruct) > MAX_INSTRUCT_CHARS:
        raise invalid(f"SessionConfig.instruct is {len(cfg.instruct)} characters; "
                      f"the limit is {MAX_INSTRUCT_CHARS}")
    rate = cfg.sample_rate or 24000
    if rate not in SUPPORTED_RATES:
        raise invalid(f"sample_rate {rate} is not supported; use one of {SUPPORTED_RATES}")
    frame_ms = cfg.frame_ms or 20
    if frame_ms not in SUPPORTED_FRAME_MS:
        raise invalid(f"frame_ms {frame_ms} is not supported; use one of {SUPPORTED_FRAME_MS}")
    if cfg.frames_per_message > MAX_FRAMES_PER_MESSAGE:
        raise invalid(f"frames_per_message {cfg.frames_per_message} is over the limit; use "
                      f"0 or 1 (one frame a message) .. {MAX_FRAMES_PER_MESSAGE}")
    if cfg.encoding not in ENCODINGS:
        raise invalid(f"encoding {cfg.encoding} is not supported; use AUDIO_ENCODING_PCM_S16LE")
    for name in ("session_id", "trace_id"):
        _check_id(name, getattr(cfg, name))
    if cfg.sampling.max_frames > MAX_UTTERANCE_FRAMES:
        raise invalid(f"sampling.max_frames {cfg.sampling.max_frames} is over the limit of "
                      f"{MAX_UTTERANCE_FRAMES} codec frames an utterance")
    sampling = _sampling(cfg.sampling)
    return ResolvedConfig(
        voice=voice,
        language=language,
        instruct=cfg.instruct,
        sample_rate=rate,
        frame_ms=frame_ms,
        frames_per_message=max(1, cfg.frames_per_message),
        seed=cfg.seed,
        sampling=sampling,
        max_frames=cfg.sampling.max_frames,
        # a label for logs and traces, not a secret: no urandom syscall (it gives up the
        # GIL on the loop; 512 calls at once sampled there: bench/loop_stalls.py)
        session_id=cfg.session_id or f"{random.getrandbits(64):016x}",
        trace_id=cfg.trace_id,
        requested_sampling=cfg.sampling,
    )
