"""Settings: defaults match the contract, bad values fail fast with the variable's name."""

from __future__ import annotations

import subprocess
import sys

import pytest
from voice_agent.settings import AgentSettings, load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("AGENT_TTS_ADDR", "AGENT_THINKER_ADDR", "AGENT_HTTP_PORT"):
        monkeypatch.delenv(k, raising=False)
    s = AgentSettings()
    assert (s.tts_addr, s.thinker_addr, s.http_port) == ("localhost:50051", "localhost:50052",
                                                         8003)
    assert s.vad_silence_ms == 200 and s.tts_frame_ms == 20
    assert (s.bridge_starter_min_chars, s.bridge_starter_max_chars) == (2, 6)
    assert (s.bridge_min_chars, s.bridge_max_chars) == (8, 12)


def test_env_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TTS_ADDR", "tts:1234")
    monkeypatch.setenv("LIVEKIT_URL", "ws://lk:7880")
    s = load_settings()
    assert s.tts_addr == "tts:1234" and s.livekit_url == "ws://lk:7880"


def test_llm_max_tokens_0_leaves_the_reply_length_to_the_thinker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LLM_MAX_TOKENS", "0")
    assert load_settings().llm_max_tokens == 0


@pytest.mark.parametrize(("env", "value", "needle"), [
    ("AGENT_TTS_ADDR", "no-port", "AGENT_TTS_ADDR"),
    ("AGENT_HTTP_PORT", "70000", "AGENT_HTTP_PORT"),
    ("AGENT_TTS_FRAME_MS", "15", "AGENT_TTS_FRAME_MS"),
    ("AGENT_BRIDGE_STARTER_MIN_CHARS", "9", "STARTER_MIN_CHARS"),
    ("AGENT_STT_FALLBACK", "whisper", "AGENT_STT_FALLBACK"),
    ("AGENT_STT_BACKEND", "whisper", "AGENT_STT_BACKEND"),
    ("AGENT_TURN_DETECTION", "model", "AGENT_VAD_SILENCE_MS >= 250"),  # 200 ms: too short
])
def test_bad_values_fail_fast(monkeypatch: pytest.MonkeyPatch, env: str, value: str,
                              needle: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SystemExit) as e:
        load_settings()
    assert needle in str(e.value)


def test_worker_mode_needs_livekit_credentials() -> None:
    env = {"PATH": "/usr/bin:/bin", "AGENT_HTTP_PORT": "0"}
    r = subprocess.run([sys.executable, "-m", "voice_agent"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "LIVEKIT_URL" in r.stderr and "--direct" in r.stderr


def test_cli_help() -> None:
    r = subprocess.run([sys.executable, "-m", "voice_agent", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--direct" in r.stdout and "AGENT_TTS_ADDR" in r.stdout


async def test_the_turn_model_loads_offline_behind_the_vad() -> None:  # the session wants a loop
    from livekit.agents.inference.eot import TurnDetector
    from voice_agent.agent import build_pipeline

    p = build_pipeline(load_settings(turn_detection="model", vad_silence_ms=250))
    detector = p.session.options.turn_handling["turn_detection"]
    assert isinstance(detector, TurnDetector) and detector._model == "turn-detector-v1-mini"
    vad = load_settings(turn_detection="vad")
    assert build_pipeline(vad).session.options.turn_handling["turn_detection"] == "vad"


def test_the_offline_ear_is_named_for_what_it_is(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """AGENT_STT_BACKEND=offline runs the offline ear (Moonshine by default); the old
    value "pocketsphinx" (it named an ear that runs Moonshine) is still taken as it."""
    from voice_agent.plugins import STT

    for old in ("pocketsphinx", "offline"):
        monkeypatch.setenv("AGENT_STT_BACKEND", old)
        monkeypatch.setenv("AGENT_STT_FALLBACK", old)
        s = AgentSettings()
        assert (s.stt_backend, s.stt_fallback) == ("offline", "offline")
    ear = STT(backend="pocketsphinx", fallback="pocketsphinx")
    assert ear.backend == "offline" and ear.ear == "moonshine"
