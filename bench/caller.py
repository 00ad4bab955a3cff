"""One caller of bench/conversations.py: a dialog over the agent's `/v1/talk` WebSocket.

Like a phone: the mic sends a 20 ms s16le message at 16 kHz every 20 ms by the clock
from the moment the call is up (speech when the dialog speaks, else digital silence), and
the time each message left is kept, so a turn's first and last speech samples have the
time the message carrying them was sent. Every reply frame is kept with its arrival
time and RMS, every event with its arrival. The caller waits out the greeting, then for
each turn: thinks, speaks, and waits for the reply to end (no reply audio for `quiet_s`,
or the agent back to listening and 0.3 s quiet; no reply within `answer_timeout_s`: it
goes on). On the dialog's barge-in turn it speaks its interruption `barge_in_after_s`
into the reply's first audible frame. All times: seconds from the level's start (`t0`).

A refusal (HTTP error before the upgrade, or an `error` message before `ready`, e.g.
close 1013 `busy`) ends the caller with status "refused"; the socket closing mid-dialog
with "dropped". Needs aiohttp (the agent's venv).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from bench.dialogs import FRAME_SAMPLES, RATE, DialogScript, Utterance

SILENCE = bytes(FRAME_SAMPLES * 2)


@dataclass(frozen=True)
class CallOpts:
    api_key: str = ""
    voice: str = ""  # the agent's voice for the call (start message); "" = its default
    quiet_s: float = 1.0
    answer_timeout_s: float = 8.0
    max_reply_s: float = 60.0
    greeting_max_s: float = 30.0
    audible_rms: float = 104.0


class Dropped(Exception):
    """The socket closed before the dialog ended."""


class Mic:
    """Paced mic: a message every 20 ms; `sent[k]` = when message k left."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, t0: float) -> None:
        self.ws, self.t0 = ws, t0
        self.sent: list[float] = []
        self.late_max = 0.0
        self._queue: deque[bytes] = deque()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        start, i = time.perf_counter(), 0
        try:
            while not self.ws.closed:
                due = start + i * FRAME_SAMPLES / RATE
                if (delay := due - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                chunk = self._queue.popleft() if self._queue else SILENCE
                now = time.perf_counter()
                self.sent.append(now - self.t0)
                self.late_max = max(self.late_max, now - due)
                if (w := self._waiters.pop(len(self.sent) - 1, None)) is not None:
                    w.set_result(None)
                await self.ws.send_bytes(chunk)
                i += 1
        except (ConnectionError, RuntimeError):
            pass
        finally:
            for w in self._waiters.values():
                if not w.done():
                    w.set_exception(Dropped("the socket closed while speaking"))

    async def say(self, pcm: np.ndarray) -> int:
        """Queue `pcm` (int16 at 16 kHz) from the next message on; returns when its last
        message has been sent, with the index of its first."""
        if self.task.done():
            raise Dropped("the socket is closed")
        first = len(self.sent) + len(self._queue)
        data = pcm.astype(np.int16).tobytes()
        data += bytes(-len(data) % (FRAME_SAMPLES * 2))
        n = len(data) // (FRAME_SAMPLES * 2)
        self._queue.extend(data[k * FRAME_SAMPLES * 2:(k + 1) * FRAME_SAMPLES * 2]
                           for k in range(n))
        fut = self._waiters[first + n - 1] = asyncio.get_running_loop().create_future()
        await fut
        return first

    def at(self, first: int, sample: int) -> float:
        """When the message carrying `sample` of the utterance that began at message
        `first` was sent."""
        return round(self.sent[first + sample // FRAME_SAMPLES], 6)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Inbox:
    """What the agent sent: frames (arrival, RMS) and events (arrival, message)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, t0: float, audible: float) -> None:
        self.ws, self.t0, self.audible = ws, t0, audible
        self.frames: list[tuple[float, float]] = []
        self.aud: list[float] = []  # arrivals of the audible frames
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.last_frame: float | None = None
        self.state, self.state_at = "", 0.0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for msg in self.ws:
            now = time.perf_counter() - self.t0
            if msg.type == aiohttp.WSMsgType.BINARY:
                x = np.frombuffer(msg.data, dtype=np.int16).astype(np.float32)
                rms = float(np.sqrt(np.mean(x * x))) if len(x) else 0.0
                self.frames.append((round(now, 6), round(rms, 1)))
                self.last_frame = now
                if rms >= self.audible:
                    self.aud.append(now)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                with contextlib.suppress(ValueError):
                    ev = json.loads(msg.data)
                    self.events.append((round(now, 6), ev))
                    if ev.get("type") == "state":
                        self.state, self.state_at = ev.get("state", ""), now

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((e for _, e in self.events if e.get("type") == kind), None)

    def audible_after(self, t: float) -> float | None:
        i = bisect.bisect_left(self.aud, t)
        return self.aud[i] if i < len(self.aud) else None


class Caller:
    def __init__(self, index: int, url: str, dialog: DialogScript, utts: list[Utterance],
                 interrupt: Utterance, offset_s: float, opts: CallOpts, t0: float) -> None:
        self.index, self.url, self.dialog = index, url, dialog
        self.utts, self.interrupt, self.offset_s = utts, interrupt, offset_s
        self.opts, self.t0 = opts, t0
        self.turns: list[dict[str, Any]] = []
        self.rec: dict[str, Any] = {
            "caller": index, "url": url, "voice": dialog.voice, "wpm": dialog.wpm,
            "offset_s": offset_s, "barge_turn": dialog.barge_turn, "status": "ok",
            "refusal": None, "error": None, "connected_s": None, "ready_s": None,
            "ended_s": None, "turns": self.turns}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        await asyncio.sleep(self.offset_s)
        headers = {"Authorization": f"Bearer {self.opts.api_key}"} if self.opts.api_key else {}
        inbox = mic = None
        try:
            async with http.ws_connect(self.url, headers=headers, heartbeat=None,
                                       max_msg_size=0) as ws:
                self.rec["connected_s"] = round(self.now(), 6)
                start: dict[str, Any] = {"type": "start", "sample_rate": RATE}
                if self.opts.voice:
                    start["voice"] = self.opts.voice
                await ws.send_json(start)
                inbox = Inbox(ws, self.t0, self.opts.audible_rms)
                await self._until(lambda: inbox.first("ready") or inbox.first("error")
                                  or ws.closed, 15.0)
                if not inbox.first("ready"):
                    with contextlib.suppress(TimeoutError):  # the close code follows
                        await asyncio.wait_for(asyncio.shield(inbox.task), 2.0)
                    err = inbox.first("error") or {}
                    self.rec["status"] = "refused"
                    self.rec["refusal"] = {"code": err.get("code", "no_ready"),
                                           "message": err.get("message"),
                                           "close_code": ws.close_code}
                    return self._done(inbox, None)
                self.rec["ready_s"] = round(self.now(), 6)
                mic = Mic(ws, self.t0)
                await self._dialog(ws, mic, inbox)
                await ws.send_json({"type": "stop"})
                await self._until(lambda: ws.closed, 10.0)
                self.rec["close_code"] = ws.close_code
        except aiohttp.WSServerHandshakeError as e:
            self.rec["status"] = "refused"
            self.rec["refusal"] = {"code": f"http_{e.status}", "message": e.message,
                                   "close_code": None}
        except Dropped as e:
            err = inbox.first("error") if inbox else None
            self.rec["status"], self.rec["error"] = "dropped", f"{e}: {err}"
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.rec["status"], self.rec["error"] = "failed", repr(e)[:300]
        finally:
            if mic is not None:
                await mic.stop()
                self.rec["mic_late_ms_max"] = round(mic.late_max * 1000, 2)
        return self._done(inbox, mic)

    def _done(self, inbox: Inbox | None, mic: Mic | None) -> dict[str, Any]:
        if self.rec["ended_s"] is None:
            self.rec["ended_s"] = round(self.now(), 6)
        if inbox is not None:
            inbox.task.cancel()
            self.rec["frames"], self.rec["events"] = inbox.frames, inbox.events
        return self.rec

    async def _until(self, pred: Any, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while not pred():
            if time.perf_counter() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _dialog(self, ws: aiohttp.ClientWebSocketResponse, mic: Mic,
                      inbox: Inbox) -> None:
        o = self.opts
        ready = self.now()
        # the greeting (if any) plays first: wait until the agent is quiet
        await self._until(lambda: self.now() - max(ready, inbox.last_frame or ready)
                          >= o.quiet_s and inbox.state in ("", "listening"), o.greeting_max_s)
        d = self.dialog
        for k, (turn, utt) in enumerate(zip(d.turns, self.utts, strict=True)):
            await asyncio.sleep(turn.think_s)
            mark = await self._speak(mic, utt, turn.kind, turn.text, turn.pause_ms)
            if k != d.barge_turn:
                await self._wait_reply(inbox, mark["t_end_s"])
                continue
            mark["barge_in_after_s"] = d.barge_in_after_s
            if not await self._until(lambda m=mark: inbox.audible_after(m["t_end_s"])
                                     is not None or ws.closed, o.answer_timeout_s):
                continue  # no reply to interrupt: the interruption is not spoken
            first = inbox.audible_after(mark["t_end_s"]) or self.now()
            await asyncio.sleep(max(0.0, first + d.barge_in_after_s - self.now()))
            it = await self._speak(mic, self.interrupt, "interrupt", d.interrupt.text, 0)
            it["interrupts"] = k
            await self._wait_reply(inbox, it["t_end_s"])
        self.rec["ended_s"] = round(self.now(), 6)

    async def _speak(self, mic: Mic, utt: Utterance, kind: str, text: str,
                     pause_ms: int) -> dict[str, Any]:
        first = await mic.say(utt.pcm)
        mark: dict[str, Any] = {
            "turn": len(self.turns), "kind": kind, "text": text, "pause_ms": pause_ms,
            "speech_start_s": mic.at(first, utt.speech_start),
            "t_end_s": mic.at(first, utt.speech_end - 1),
            "speech_s": round(utt.duration_s, 3)}
        if utt.pause is not None:
            mark["pause_start_s"] = mic.at(first, utt.pause[0] - 1)
            mark["pause_end_s"] = mic.at(first, utt.pause[1])
        self.turns.append(mark)
        return mark

    async def _wait_reply(self, inbox: Inbox, t_end: float) -> None:
        """Until the reply after `t_end` has ended (or none came in time)."""
        o = self.opts
        while True:
            await asyncio.sleep(0.02)
            now = self.now()
            first = inbox.audible_after(t_end)
            if inbox.ws.closed:
                raise Dropped("the agent closed the call")
            if first is None:
                if now - t_end > o.answer_timeout_s:
                    return
                continue
            quiet = now - (inbox.last_frame or first)
            if (quiet >= o.quiet_s or now - first > o.max_reply_s
                    or (quiet >= 0.3 and inbox.state == "listening"
                        and inbox.state_at > first)):
                return
