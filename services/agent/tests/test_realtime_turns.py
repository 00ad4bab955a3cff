"""`/v1/realtime`'s server VAD ends a turn by the agent's one end-of-turn policy
(conversation/parts.py, as /v1/talk's AgentSession does): after the VAD's end of speech
the turn stays open min_endpointing_delay_s when its words could end it, up to
max_endpointing_delay_s when they cannot ("... how to get to"), and speech within that
wait joins the same item. It used to end every turn on Silero's silence alone: a 0.45 s
pause inside a sentence was two turns.

Synthetic speech (espeak-ng) through the real Silero VAD; what the ear heard is fixed per
test (the words decide, not the ear's accuracy on synthetic speech); no backend runs
(create_response off: no reply is asked for)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from voice_agent.plugins import STT

from .backends import espeak
from .test_realtime_bad_clients import settings
from .test_ws_talk import serve

pytestmark = pytest.mark.timeout(120)


def at_24k(pcm16k: np.ndarray) -> np.ndarray:
    t_in = np.arange(len(pcm16k)) / 16000
    t_out = np.arange(len(pcm16k) * 3 // 2) / 24000
    return np.interp(t_out, t_in, pcm16k.astype(np.float32)).astype(np.int16)


async def turns_heard(tmp: Path, monkeypatch: pytest.MonkeyPatch, mode: str, pause_s: float,
                      first_words: str, respond: bool = False) -> list[dict[str, Any]]:
    """Two spoken parts with `pause_s` of silence between, on server VAD; the ear hears
    `first_words` for the first part. Returns the server's events."""
    heard = [first_words, "the nearest pharmacy"]

    async def hear(self: STT, frames: list[Any], utt: Any) -> str:
        return heard.pop(0) if heard else "the nearest pharmacy"

    monkeypatch.setattr(STT, "_sphinx", hear)
    agent = await serve(settings(turn_detection=mode, stt_backend="offline",
                                 min_endpointing_delay_s=0.3, max_endpointing_delay_s=3.0))
    a = at_24k(espeak("Can you tell me how to get to", tmp))
    b = at_24k(espeak("the nearest pharmacy", tmp))
    silence = np.zeros(int(24000 * pause_s), dtype=np.int16)
    pcm = np.concatenate([np.zeros(7200, np.int16), a, silence, b, np.zeros(24000 * 4, np.int16)])
    got: list[dict[str, Any]] = []
    try:
        url = agent.http.replace("http://", "ws://") + "/v1/realtime"
        async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
            async def read() -> None:
                async for msg in ws:
                    got.append(json.loads(msg.data))

            reader = asyncio.create_task(read())
            await ws.send_json({"type": "session.update", "session": {"audio": {"input": {
                "turn_detection": {"type": "server_vad", "create_response": respond}}}}})
            n, t0 = 960, time.perf_counter()  # 40 ms appends, paced by the clock
            for i in range(0, len(pcm), n):
                await ws.send_json({"type": "input_audio_buffer.append", "audio":
                                    base64.b64encode(pcm[i:i + n].tobytes()).decode()})
                await asyncio.sleep(max(0.0, t0 + (i // n + 1) * 0.04 - time.perf_counter()))
            reader.cancel()
    finally:
        await agent.runner.cleanup()
    return got


def of(got: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in got if e["type"] == kind]


async def test_a_pause_after_unfinished_words_is_one_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = await turns_heard(tmp_path, monkeypatch, "text", 1.0, "can you tell me how to get to")
    committed = of(got, "input_audio_buffer.committed")
    assert len(committed) == 1, [e["type"] for e in got]
    assert len(of(got, "input_audio_buffer.speech_started")) == 1
    [stopped] = of(got, "input_audio_buffer.speech_stopped")
    assert stopped["item_id"] == committed[0]["item_id"]
    [done] = of(got, "conversation.item.input_audio_transcription.completed")
    # both parts' words in the one item
    assert done["transcript"] == "can you tell me how to get to the nearest pharmacy"
    assert done["usage"]["seconds"] > 2.0  # both parts' audio in the one item


async def test_the_same_pause_after_words_that_end_a_turn_ends_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a complete-sounding first part ends its turn after the short delay,
    and the second part is a turn of its own (as with the silence rule: "vad")."""
    for mode in ("text", "vad"):
        got = await turns_heard(tmp_path, monkeypatch, mode, 1.0, "can you tell me the way")
        assert len(of(got, "input_audio_buffer.committed")) == 2, (mode, [e["type"] for e in got])


async def test_a_reply_made_during_the_hold_is_dropped_unheard_when_the_user_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With create_response, a reply starts during each wait (held, its events kept back):
    the one made after "... get to" is dropped when the user goes on, never seen; the one
    for the whole turn goes out after the commit. (No thinker answers here: that reply
    fails, which is all the client may see of it.)"""
    got = await turns_heard(tmp_path, monkeypatch, "text", 1.0, "can you tell me how to get to",
                            respond=True)
    kinds = [e["type"] for e in got]
    assert kinds.count("input_audio_buffer.committed") == 1, kinds
    created = of(got, "response.created")
    assert len(created) == 1, kinds  # the dropped reply said nothing
    assert kinds.index("response.created") > kinds.index("input_audio_buffer.committed")
    assert {e["response"]["id"] for e in of(got, "response.done")} == {created[0]["response"]["id"]}


async def test_the_session_reports_its_real_turn_settings_and_takes_semantic_vad() -> None:
    """session.created says the VAD's values the agent runs with (not null); semantic_vad
    takes an eagerness (it scales the policy's waits: test_turn_end.py) and reports it;
    a wrong eagerness is the client's error, naming the field."""
    from .test_realtime_bad_clients import Session

    s = Session()
    try:
        [created] = [e for e in map(json.loads, s.s.outbox.pending())
                     if e["type"] == "session.created"]
        td = created["session"]["audio"]["input"]["turn_detection"]
        agent = s.s.settings
        assert td["type"] == "server_vad"
        assert td["threshold"] == agent.vad_activation_threshold
        assert td["silence_duration_ms"] == agent.vad_silence_ms
        got = await s.send({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}})
        [updated] = [e for e in got if e["type"] == "session.updated"]
        td = updated["session"]["audio"]["input"]["turn_detection"]
        assert td["type"] == "semantic_vad" and td["eagerness"] == "high"
        assert s.s.cfg.turn_detection is not None and s.s.cfg.turn_detection.eagerness == "high"
        # the conversation's policy runs at that eagerness: the framework's waits and its
        # own (a word or two's) alike
        opts = s.s.pipeline.session.options.turn_handling["endpointing"]
        assert (opts["min_delay"], opts["max_delay"]) == pytest.approx(
            (agent.min_endpointing_delay_s / 2, agent.max_endpointing_delay_s / 2))
        assert s.s.pipeline.turn.delays == pytest.approx(  # type: ignore[union-attr]
            (opts["min_delay"], opts["max_delay"]))
        got = await s.send({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}}})
        [err] = [e for e in got if e["type"] == "error"]
        assert err["error"]["param"] == "session.turn_detection.eagerness"
        assert err["error"]["type"] == "invalid_request_error"
    finally:
        await s.close()
