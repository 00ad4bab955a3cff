"""Per-turn tracking: the latency report's schema (the web page's data message) and the
Prometheus metrics it feeds."""

from __future__ import annotations

import json
import time

from voice_agent.metrics import LATENCY_KEYS, REGISTRY, TurnTracker
from voice_agent.speech_end import SpeechEnd


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def test_a_turn_reports_the_latency_message_once() -> None:
    sent: list[dict[str, object]] = []
    tracker = TurnTracker(on_report=sent.append)
    eot0 = sample("agent_eot_to_first_audio_seconds_count")
    turns0 = sample("agent_turns_total")
    now = time.perf_counter()
    turn = tracker.user_turn_ended(tracker.end_of_speech(now, 0.2))
    tracker.stt_started()
    tracker.stt_done()
    assert tracker.llm_started() == turn.trace_id  # the thinker's request_id
    # a second call of the turn (preemptive generation replaced) may overlap the first's
    # abort at the thinker, which refuses an id still generating: its own id
    assert tracker.llm_started() == f"{turn.trace_id}-2"
    tracker.llm_first_token()
    assert tracker.tts_text_sent() == turn.trace_id  # the TTS SessionConfig.trace_id
    tracker.tts_audio_received()
    tracker.audio_published()
    tracker.audio_published()  # a second frame: no second report
    assert len(sent) == 1
    msg = sent[0]
    assert tuple(msg) == LATENCY_KEYS == ("trace_id", "eot_to_first_audio_ms", "llm_ttft_ms",
                                          "tts_ttfa_ms")
    assert msg["trace_id"] == turn.trace_id and len(str(msg["trace_id"])) == 16
    assert isinstance(msg["eot_to_first_audio_ms"], float)
    assert msg["eot_to_first_audio_ms"] >= 200.0  # type: ignore[operator]  # the hangover
    json.dumps(msg)  # the data message is JSON
    rec = tracker.history[-1]
    assert rec["stt_ms"] is not None and rec["vad_to_stt_ms"] is not None
    assert sample("agent_eot_to_first_audio_seconds_count") == eot0 + 1
    assert sample("agent_turns_total") == turns0 + 1


def test_interruptions_and_errors_are_counted() -> None:
    tracker = TurnTracker()
    n0 = sample("agent_interruptions_total")
    c0 = sample("agent_cancel_to_silence_seconds_count")
    e0 = sample("agent_errors_total", component="tts")
    tracker.interrupted(0.004)
    tracker.error("tts", "UNAVAILABLE")
    assert sample("agent_interruptions_total") == n0 + 1
    assert sample("agent_cancel_to_silence_seconds_count") == c0 + 1
    assert sample("agent_errors_total", component="tts") == e0 + 1


def test_a_reply_without_an_utterance_opens_its_own_turn() -> None:
    tracker = TurnTracker()
    trace = tracker.tts_text_sent()  # e.g. the greeting through the TTS
    tracker.tts_audio_received()
    tracker.audio_published()
    rec = tracker.history[-1]
    assert rec["trace_id"] == trace and rec["kind"] == "say"
    assert rec["eot_to_first_audio_ms"] is None and rec["tts_ttfa_ms"] is not None


def test_an_answered_turn_always_has_its_end_of_speech() -> None:
    """The reply came before the session's VAD ended the turn (its transcript came from
    the STT's own VAD stream, which located the end first; or the session's VAD heard no
    speech at all): the turn still runs from that end, and the session's VAD event for
    the same speech, if it comes, opens no second turn. (It reported `null`.)"""
    sent: list[dict[str, object]] = []
    tracker = TurnTracker(on_report=sent.append)
    t = time.perf_counter()
    turns0 = sample("agent_turns_total")
    stt0 = sample("agent_stt_seconds_count")
    tracker.vad_speech_ended(SpeechEnd(at=t - 0.5, decided=t - 0.25, silence_s=0.22,
                                       lag_s=0.03))  # the STT's stream
    tracker.stt_started()
    tracker.stt_done()
    trace = tracker.llm_started()  # the framework answers the transcript
    tracker.llm_first_token()
    tracker.tts_text_sent()
    tracker.tts_audio_received()
    tracker.audio_published(at=t)
    assert sent[-1]["trace_id"] == trace
    assert sent[-1]["eot_to_first_audio_ms"] == 500.0
    rec = tracker.history[-1]
    assert rec["vad_lag_ms"] == 30.0 and rec["stt_ms"] is not None
    # the session's VAD, late, for the same speech (its own windows: a few ms apart)
    late = SpeechEnd(at=t - 0.49, decided=t + 0.5, silence_s=0.22, lag_s=1.0)
    tracker.vad_speech_ended(late)
    assert tracker.user_turn_ended(late).trace_id == trace
    assert len(tracker.history) == 1
    assert sample("agent_turns_total") == turns0 + 1
    assert sample("agent_stt_seconds_count") == stt0 + 1
    # a later reply with no new speech (a fallback phrase) does not reuse that end
    tracker.llm_started()
    tracker.audio_published(at=t + 2)
    assert tracker.history[-1]["eot_to_first_audio_ms"] is None


def test_a_preemptive_reply_belongs_to_the_speech_it_answers_however_late_the_vad() -> None:
    """The thinker call started on a transcript before the session's VAD ended the turn,
    2 s before (a busy host): the turn adopts it (it opened a second turn after 0.5 s)."""
    tracker = TurnTracker()
    t = time.perf_counter()
    trace = tracker.llm_started()
    tracker.llm_first_token()
    turn = tracker.user_turn_ended(SpeechEnd(at=t - 0.3, decided=t + 2.0, silence_s=0.22))
    assert turn.trace_id == trace
    tracker.tts_text_sent()
    tracker.audio_published(at=t + 2.5)
    rec = tracker.history[-1]
    assert rec["eot_to_first_audio_ms"] == 2800.0 and rec["llm_ttft_ms"] is not None
