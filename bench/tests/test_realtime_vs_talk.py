"""bench/realtime_vs_talk.py's pure parts (no agent, no aiohttp / openai): the audible
onset, the mic's chunks and its clock marks (a fake socket), the rows and the ratio, the
arguments. The run itself needs a stack (its README: bench/results/*-realtime-vs-talk/)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from bench.realtime_vs_talk import (
    CHUNK,
    LEAD_S,
    RATE,
    Turn,
    chunks,
    door_row,
    first_audible,
    parse_args,
    ratio,
    table,
)


def s16(*samples: int) -> bytes:
    return np.array(samples, dtype=np.int16).tobytes()


def test_first_audible_is_the_first_sample_over_300_either_sign() -> None:
    assert first_audible(s16(0, 300, -300, 12)) is None  # 300 itself is not audible
    assert first_audible(s16(0, 5, -301, 400)) == 2
    assert first_audible(s16(-32768)) == 0  # no int16 overflow in abs
    assert first_audible(b"") is None
    assert first_audible(s16(0, 999)[:3]) is None  # an odd byte is dropped, not a crash


def test_chunks_are_20_ms_and_the_last_is_zero_padded() -> None:
    out = chunks(np.arange(CHUNK * 2 + 5, dtype=np.int16))
    assert [len(c) for c in out] == [CHUNK * 2] * 3
    assert np.frombuffer(out[2], dtype=np.int16)[:5].tolist() == [2 * CHUNK + k
                                                                   for k in range(5)]
    assert not any(np.frombuffer(out[2], dtype=np.int16)[5:])


def test_a_turn_clocks_from_the_chunk_with_the_last_speech_sample() -> None:
    speech = np.full(CHUNK * 3 + 1, 1000, dtype=np.int16)  # the last sample: a 4th chunk

    async def go() -> tuple[Turn, list[bytes], list[float]]:
        turn = Turn("talk", 0, "q", speech, answer_timeout_s=5.0)
        sent: list[bytes] = []
        at: list[float] = []

        async def send(b: bytes) -> None:
            sent.append(b)
            at.append(time.perf_counter())
            if len(sent) == 2:
                turn.audio(s16(0, 9999))  # before the end of speech: not the reply
            if len(sent) == turn.last_speech_msg + 3:
                turn.audio(s16(0, 100))  # reply audio, not audible
            if len(sent) == turn.last_speech_msg + 5:
                turn.audio(s16(0, 0, 301))  # the first audible reply

        mic = asyncio.create_task(turn.mic(send))
        await turn.wait_answer()
        await mic
        return turn, sent, at

    turn, sent, at = asyncio.run(go())
    lead = int(RATE * LEAD_S) // CHUNK
    assert turn.last_speech_msg == lead + 3
    assert sent[turn.last_speech_msg] != bytes(CHUNK * 2)  # it holds the last speech sample
    assert not any(np.frombuffer(b"".join(sent[turn.last_speech_msg + 1:]), dtype=np.int16))
    assert turn.t_end == pytest.approx(at[turn.last_speech_msg], abs=1e-3)
    rec = turn.record()
    assert rec["ok"] and rec["early_audible_messages"] == 1
    # 4 and 2 chunks after the end's chunk (20 ms each, paced): the send times say so
    assert rec["eot_to_first_audio_ms"] == pytest.approx(
        (at[turn.last_speech_msg + 4] - at[turn.last_speech_msg]) * 1e3, abs=2)
    assert 70 <= rec["eot_to_first_audio_ms"] <= 150
    assert 30 <= rec["eot_to_first_reply_audio_ms"] <= 110
    # paced by the clock: the whole turn took about its chunks' time
    assert at[-1] - at[0] == pytest.approx((len(sent) - 1) * 0.02, abs=0.05)


def test_a_turn_without_an_audible_reply_is_a_failure() -> None:
    async def go() -> Turn:
        turn = Turn("realtime", 3, "q", np.full(CHUNK, 1000, dtype=np.int16), 0.1)

        async def send(b: bytes) -> None:
            turn.audio(s16(0, 200))

        mic = asyncio.create_task(turn.mic(send))
        await turn.wait_answer()
        turn.done.set()
        await mic
        return turn

    rec = asyncio.run(go()).record()
    assert not rec["ok"] and "no audible reply within 0.1 s" in rec["error"]
    assert rec["eot_to_first_audio_ms"] is None and rec["eot_to_first_reply_audio_ms"] >= 0
    assert not Turn("talk", 0, "q", np.ones(10, np.int16), 1).record("boom")["ok"]


def turns(door: str, ms: list[float | None]) -> list[dict]:
    return [{"door": door, "ok": v is not None, "eot_to_first_audio_ms": v} for v in ms]


def test_rows_percentiles_failures_and_the_ratio() -> None:
    talk = [float(v) for v in range(100, 1100, 100)]  # 100 .. 1000
    rt = [v * 1.5 for v in talk]
    rows = [door_row("talk", turns("talk", [*talk, None])),
            door_row("realtime", turns("realtime", rt))]
    assert rows[0] == {"door": "talk", "n": 10, "failures": 1, "p50_ms": 500.0,
                       "p95_ms": 1000.0, "mean_ms": 550.0, "min_ms": 100.0, "max_ms": 1000.0}
    assert rows[1]["n"] == 10 and rows[1]["failures"] == 0 and rows[1]["p50_ms"] == 750.0
    assert ratio(rows) == {"p50": 1.5, "p95": 1.5}
    text = table(rows, ratio(rows))
    assert "| /v1/talk | 10 | 1 | 500 / 1,000 / 550 / 100 / 1,000 |" in text
    assert "realtime / talk: p50 1.5, p95 1.5" in text


def test_a_door_with_no_answer_has_no_numbers_and_no_ratio() -> None:
    rows = [door_row("talk", turns("talk", [200.0])),
            door_row("realtime", turns("realtime", [None, None]))]
    assert rows[1] == {"door": "realtime", "n": 0, "failures": 2, "p50_ms": None,
                       "p95_ms": None, "mean_ms": None, "min_ms": None, "max_ms": None}
    assert ratio(rows) == {"p50": None, "p95": None}
    assert "| /v1/realtime | 0 | 2 | - / - / - / - / - |" in table(rows, ratio(rows))


def test_arguments() -> None:
    a = parse_args([])
    assert (a.agent, a.turns, a.warmup, a.start_mesh) == ("127.0.0.1:8003", 10, 1, False)
    for bad in (["--turns", "0"], ["--agent", "ws://h:1/v1/talk"], ["--answer-timeout", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
