"""The page's turn-taking feedback ("you cut me off", "too slow"): the recorder's folder
(a wav + json pair per saved turn, written atomically, bounded, nothing when off), and
`{"type": "feedback"}` on a real /v1/talk socket against the real agent server, with the
tiny TTS and thinker and espeak-ng speech (test_ws_talk.py's helpers).
"""

from __future__ import annotations

import asyncio
import json
import os
import wave
from datetime import datetime
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from voice_agent import feedback
from voice_agent.conversation.turn_end import Decision
from voice_agent.feedback import FeedbackDisabled, FeedbackRecorder
from voice_agent.http import make_app
from voice_agent.metrics import REGISTRY
from voice_agent.settings import AgentSettings
from voice_agent.talk.protocol import FEEDBACK_LABELS, KEPT_ERRORS, SPEC
from voice_agent.talk.session import VERDICTS

from .backends import Server, espeak
from .test_ws_talk import Inbox, Mic, at_48k, hang_up, serve, settings_for

KEYS = {"audio", "label", "stop_s", "resume_s", "text", "kind", "family", "voice", "source",
        "decision"}
DECISION_KEYS = {"detector", "p_end", "wait_s", "fallback", "session_id", "saved_at"}


def decision(seconds: float = 2.0, stop_s: float | None = 1.5, text: str = "I want to") -> Decision:
    """A decision on `seconds` of audio: a tone up to `stop_s`, then silence."""
    t = np.arange(int(seconds * 16000)) / 16000
    audio = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    audio[int((stop_s or seconds) * 16000):] = 0
    return Decision(detector="text", transcript=text, p_end=0.2, wait_s=1.0, at=0.0,
                    audio=audio, stop_s=stop_s)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16), w.getframerate()


def saved(label: str) -> float:
    return REGISTRY.get_sample_value("agent_feedback_saved_total", {"label": label}) or 0.0


def test_a_saved_turn_is_a_wav_and_a_json_pair(tmp_path: Path) -> None:
    rec = FeedbackRecorder(tmp_path / "fb", max_mb=200)  # made if missing
    before = saved("unfinished")
    first = rec.save_sync(decision(), "unfinished", "sess1")
    second = rec.save_sync(decision(stop_s=None, text="done."), "complete", "sess1")
    assert rec.pairs() == [first, second] == sorted([second, first])  # ids sort by time
    assert sorted(p.name for p in (tmp_path / "fb").iterdir()) == sorted(
        f"{i}.{ext}" for i in (first, second) for ext in ("wav", "json"))  # no tmp left
    pcm, rate = read_wav(tmp_path / "fb" / f"{first}.wav")
    assert rate == 16000 and len(pcm) == 32000
    assert np.abs(pcm[:24000]).max() > 16000 and not pcm[24000:].any()
    meta = json.loads((tmp_path / "fb" / f"{first}.json").read_text())
    assert set(meta) == KEYS and set(meta["decision"]) == DECISION_KEYS
    assert meta | {"decision": None} == {
        "audio": f"{first}.wav", "label": "unfinished", "stop_s": 1.5, "resume_s": None,
        "text": "I want to", "kind": "feedback", "family": "recorded", "voice": "",
        "source": "feedback", "decision": None}
    d = meta["decision"]
    assert (d["detector"], d["p_end"], d["wait_s"], d["fallback"], d["session_id"]) == (
        "text", 0.2, 1.0, False, "sess1")
    assert datetime.fromisoformat(d["saved_at"]).tzinfo is not None
    # no stop located: the audio's end
    assert json.loads((tmp_path / "fb" / f"{second}.json").read_text())["stop_s"] == 2.0
    assert saved("unfinished") == before + 1
    # the same turn relabelled: its json rewritten, the pair's id and wav kept
    assert rec.save_sync(decision(), "complete", "sess1", pair_id=first) == first
    assert json.loads((tmp_path / "fb" / f"{first}.json").read_text())["label"] == "complete"
    assert rec.pairs() == [first, second]
    with pytest.raises(ValueError, match="not one of"):
        rec.save_sync(decision(), "cut_off", "sess1")  # the page's word, not the recorder's
    with pytest.raises(ValueError, match="no audio"):
        rec.save_sync(Decision("text", "x", 0.9, 0.3, 0.0, None), "complete", "sess1")


def test_a_failed_write_leaves_no_half_pair(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The wav is in place before the json is written; the json's write fails (a full
    disk): neither stays, nor a temporary file. A reader lists json files: it never sees
    a pair without its wav or a file half written."""
    rec = FeedbackRecorder(tmp_path, max_mb=200)
    real = feedback.os.replace
    calls: list[str] = []

    def replace(src: object, dst: object) -> None:
        calls.append(str(dst))
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(feedback.os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        rec.save_sync(decision(), "unfinished", "s")
    assert [Path(c).suffix for c in calls] == [".wav", ".json"]
    assert list(tmp_path.iterdir()) == []


def test_a_crashed_writes_leftovers_go_at_start(tmp_path: Path) -> None:
    old = ["20260101T000000000000Z-abcdef.wav", ".20260101T000000000000Z-abcdef.json.1a2b.tmp"]
    fresh = "20260101T000000000001Z-abcdef.wav"  # another agent's write under way
    for name in [*old, fresh, "20260101T000000000002Z-abcdef.wav",
                 "20260101T000000000002Z-abcdef.json"]:
        (tmp_path / name).write_bytes(b"x")
    for name in [*old, "20260101T000000000002Z-abcdef.wav"]:
        os.utime(tmp_path / name, (0, 0))
    FeedbackRecorder(tmp_path, max_mb=200)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        fresh, "20260101T000000000002Z-abcdef.json", "20260101T000000000002Z-abcdef.wav"]


def test_the_folder_stays_under_max_mb_the_oldest_pairs_go(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the deployer's")  # not a pair: never counted or deleted
    rec = FeedbackRecorder(tmp_path, max_mb=1)
    ids = [rec.save_sync(decision(8.0, 7.0), "unfinished", "s") for _ in range(5)]
    # a pair of 8 s is 256 KB: 3 fit in 1 MB, 4 do not
    assert rec.pairs() == ids[2:]
    assert sum(p.stat().st_size for p in tmp_path.glob("2*")) <= 1_000_000
    assert (tmp_path / "notes.txt").read_text() == "the deployer's"
    # a half pair (a crash between the renames) is counted and goes first
    (tmp_path / f"{ids[0]}.wav").write_bytes(bytes(300_000))
    rec.save_sync(decision(8.0, 7.0), "complete", "s")
    assert not (tmp_path / f"{ids[0]}.wav").exists() and len(rec.pairs()) == 3


def test_disabled_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rec = FeedbackRecorder("", max_mb=200)
    assert not rec.enabled and rec.pairs() == []
    with pytest.raises(FeedbackDisabled, match="AGENT_FEEDBACK_DIR"):
        rec.save_sync(decision(), "unfinished", "s")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_made_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "feedback"
    with pytest.raises(ValueError, match=r"AGENT_FEEDBACK_DIR='.*/file/feedback' cannot be "
                                         r"created or written"):
        make_app(AgentSettings(feedback_dir=str(bad), http_port=0))


def test_the_pages_labels_are_the_recorders() -> None:
    assert tuple(VERDICTS) == FEEDBACK_LABELS
    assert set(VERDICTS.values()) == set(feedback.LABELS)
    assert set(SPEC["errors"]) >= KEPT_ERRORS


async def say_and_wait_for_the_turn(mic: Mic, inbox: Inbox, speech: bytes) -> str:
    """Speak; the user's transcript (the turn is decided by then)."""
    mic.say(speech)
    await inbox.wait(lambda: [e for e in inbox.of("transcript") if e["role"] == "user"], 60)
    return next(e["text"] for e in inbox.of("transcript") if e["role"] == "user")


async def next_event(inbox: Inbox, kinds: tuple[str, ...], after: int) -> dict:
    await inbox.wait(lambda: [e for _, e in inbox.events[after:] if e["type"] in kinds], 20)
    return next(e for _, e in inbox.events[after:] if e["type"] in kinds)


async def feedback_answer(ws: aiohttp.ClientWebSocketResponse, inbox: Inbox,
                          **msg: object) -> dict:
    """Send a feedback message; the agent's answer (feedback_saved or an error)."""
    n = len(inbox.events)
    await ws.send_json({"type": "feedback", **msg})
    return await next_event(inbox, ("feedback_saved", "error"), n)


async def test_feedback_after_a_spoken_turn_saves_it(tts_server: Server, thinker: Server,
                                                     tmp_path: Path) -> None:
    folder = tmp_path / "feedback"
    agent = await serve(settings_for(tts_server, thinker, feedback_dir=str(folder),
                                     llm_max_tokens=16, tts_max_frames=12))
    question = at_48k(espeak("What is the weather like today?", tmp_path))
    before = saved("unfinished"), saved("complete")
    try:
        await asyncio.wait_for(agent.hub.ready.wait(), 120)
        async with aiohttp.ClientSession() as http, http.ws_connect(agent.url) as ws:
            await ws.send_json({"type": "start", "sample_rate": 48000})
            inbox = Inbox(ws)
            await inbox.wait(lambda: inbox.of("ready"), 10)
            mic = Mic(ws)
            # before any turn; a label the protocol does not have: errors, the call goes on
            early = await feedback_answer(ws, inbox, label="cut_off")
            bad = await feedback_answer(ws, inbox, label="sooner")
            missing = await feedback_answer(ws, inbox)
            heard = await say_and_wait_for_the_turn(mic, inbox, question)
            cut = await feedback_answer(ws, inbox, label="cut_off")
            pair = folder / f"{cut.get('id')}.json"
            meta_cut = json.loads(pair.read_text()) if pair.exists() else {}
            slow = await feedback_answer(ws, inbox, label="too_slow")  # the same turn
            await hang_up(mic, ws, inbox)
    finally:
        await agent.runner.cleanup()
    ready = inbox.of("ready")[0]
    assert ready["feedback"] is True
    assert (early["type"], early["code"]) == ("error", "feedback_no_turn"), early
    assert (bad["type"], bad["code"]) == ("error", "feedback_bad_label"), bad
    assert "'sooner'" in bad["message"] and "'cut_off', 'too_slow'" in bad["message"]
    assert missing["code"] == "feedback_bad_label", missing
    assert cut["type"] == "feedback_saved" and cut["label"] == "cut_off", cut
    assert slow == {"type": "feedback_saved", "id": cut["id"], "label": "too_slow"}
    assert ws.close_code == 1000  # the refusals never ended the call
    # one pair: the wav holds the spoken question, the json the agent's decision
    assert sorted(p.name for p in folder.iterdir()) == [f"{cut['id']}.json", f"{cut['id']}.wav"]
    pcm, rate = read_wav(folder / f"{cut['id']}.wav")
    assert rate == 16000 and 1.0 < len(pcm) / rate <= 8.0
    windows = np.abs(pcm[: len(pcm) // 160 * 160].astype(np.int32)).reshape(-1, 160)
    loud = windows.max(axis=1) > 1000  # 10 ms windows with speech
    assert loud.sum() * 0.01 > 1.0, f"{loud.sum() * 10} ms of speech in the wav"
    assert meta_cut["label"] == "unfinished" and set(meta_cut) == KEYS
    assert 0.5 < meta_cut["stop_s"] <= len(pcm) / rate
    tail = pcm[int(meta_cut["stop_s"] * rate) + 320:]  # after the speech: the mic's silence
    assert not len(tail) or np.abs(tail).max() < 1000, np.abs(tail).max()
    assert meta_cut["text"].strip() and meta_cut["text"].strip() == heard.strip()
    d = meta_cut["decision"]
    assert d["detector"] == "text" and 0.0 <= d["p_end"] <= 1.0 and d["fallback"] is False
    assert d["wait_s"] > 0 and d["session_id"] == ready["session_id"]
    meta = json.loads((folder / f"{cut['id']}.json").read_text())
    assert meta["label"] == "complete"  # relabelled: "too slow" came last
    assert (saved("unfinished"), saved("complete")) == (before[0] + 1, before[1] + 1)
    others = [e for e in inbox.of("error") if e["code"] not in KEPT_ERRORS]
    assert others == [], others


async def feedback_in_a_call(url: str) -> tuple[dict, dict, int | None]:
    """A call that sends "cut_off" at once, streams a little more audio, and stops:
    its ready, the answer to the feedback, and the close code."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_json({"type": "start", "sample_rate": 16000})
        inbox = Inbox(ws)
        await inbox.wait(lambda: inbox.of("ready"), 10)
        answer = await feedback_answer(ws, inbox, label="cut_off")
        await ws.send_bytes(bytes(640) * 10)  # still in the call
        await asyncio.sleep(0.3)
        assert not ws.closed
        await ws.send_json({"type": "stop"})
        await inbox.wait(lambda: ws.closed, 20)
    return inbox.of("ready")[0], answer, ws.close_code


async def test_feedback_off_is_refused_and_the_call_goes_on(
        tts_server: Server, thinker: Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENT_FEEDBACK_DIR empty (the default), or a detector that keeps no decision
    (AGENT_TURN_DETECTION=vad): `ready` says feedback false, a feedback message gets
    `feedback_disabled` naming the setting, nothing is written, the call goes on."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "feedback"
    cases = [({"feedback_dir": ""}, "AGENT_FEEDBACK_DIR"),
             ({"feedback_dir": str(folder), "turn_detection": "vad"},
              "AGENT_TURN_DETECTION=vad")]
    before = saved("unfinished")
    for kw, named in cases:
        agent = await serve(settings_for(tts_server, thinker, **kw))
        try:
            ready, err, close_code = await feedback_in_a_call(agent.url)
        finally:
            await agent.runner.cleanup()
        assert ready["feedback"] is False
        assert err["code"] == "feedback_disabled" and named in err["message"], err
        assert close_code == 1000
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "feedback") == []
    assert not folder.exists() or list(folder.iterdir()) == []
    assert saved("unfinished") == before
