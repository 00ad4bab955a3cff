"""The load's calls over the server's other two fronts, beside `client.Load`'s gRPC one:
`POST /v1/audio/speech` (OpenAI's, streamed PCM) and the WebSocket
`/v1/audio/speech/stream`, each call the same plan as a gRPC call (voice, language, seed,
`sampling.max_frames`, the sentence), recorded in the same `Record` and checked by the
same `StreamChecker` (its player clock gives the underruns).

HTTP: the audio is bare PCM (no frames, no events), so the checker is fed whole frames
cut from the bytes as they arrive, the session counted as started with the response's
headers (they leave with the first audio); TTFA = the first audio bytes. The server sends
it unpaced (a download: as fast as it is made), gRPC and WS paced (`TTS_PACE_LEAD_S`).
WS: binary messages are one frame each, events JSON; a frame belongs to the utterance of
the last `first_audio` (a frame carries no id), and an utterance's `flushed` or
`truncated` closes it (there is no last_in_utterance flag), so a frame after either is a
violation. TTFA = the first binary frame.

Refusals, as RESOURCE_EXHAUSTED is for gRPC: HTTP 429 (at capacity) and 503 (draining or
restarting), WS close 1013 and 1012 (the same two; an `error` event says why first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

import aiohttp
from voice.tts.v1 import tts_pb2

from bench.soak.checker import TRUNCATED, Record, StreamChecker, settle
from bench.soak.plan import Plan, pieces, words

SPEECH_PATH = "/v1/audio/speech"
WS_PATH = "/v1/audio/speech/stream"
HTTP_REFUSALS = (429, 503)
WS_REFUSALS = (1013, 1012)
WS_EVENTS = {"started": tts_pb2.Event.SESSION_STARTED,
             "first_audio": tts_pb2.Event.FIRST_AUDIO, "flushed": tts_pb2.Event.FLUSHED,
             "stopped": tts_pb2.Event.STOPPED, "reset": tts_pb2.Event.RESET,
             "truncated": TRUNCATED}


class Front:
    """One client process's HTTP side: a session (no connection limit: open loop) and the
    call of its protocol, `http` or `ws`."""

    def __init__(self, protocol: str, opts: dict[str, Any]) -> None:
        assert protocol in ("http", "ws"), protocol
        self.protocol = protocol
        self.o = opts
        host = opts["addr"].rsplit(":", 1)[0]
        base = f"{'ws' if protocol == 'ws' else 'http'}://{host}:{opts['http_port']}"
        self.url = base + (WS_PATH if protocol == "ws" else SPEECH_PATH)
        self.frame_ms = int(opts["frame_ms"])
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def _checker(self, rec: Record, t_dispatch: float, sample_rate: int) -> StreamChecker:
        frame_bytes = sample_rate * self.frame_ms // 1000 * 2
        return StreamChecker(rec, t_dispatch, self.frame_ms, frame_bytes,
                             self.o["underrun_tolerance_ms"] / 1e3)

    async def call(self, p: Plan, rec: Record, t_dispatch: float) -> None:
        if self.protocol == "http":
            await self._http(p, rec, t_dispatch)
        else:
            await self._ws(p, rec, t_dispatch)

    def _frame(self, chk: StreamChecker, pcm: bytes, n: int, uid: int) -> tts_pb2.AudioFrame:
        return tts_pb2.AudioFrame(seq=chk.seq, start_ms=chk.seq * self.frame_ms, pcm=pcm,
                                  frames=n, utterance_id=uid)

    async def _http(self, p: Plan, rec: Record, t_dispatch: float) -> None:
        assert self.session is not None
        body = {"input": p.text, "voice": p.voice, "language": p.language,
                "response_format": "pcm", "stream": True, "seed": p.seed,
                "sample_rate": int(self.o["sample_rate"]),
                "sampling": {"max_frames": p.max_frames}}
        try:
            async with self.session.post(self.url, json=body,
                                         headers={"X-Trace-Id": f"soak{p.index}"}) as resp:
                now = time.perf_counter()
                rec.code = f"HTTP_{resp.status}"
                if resp.status != 200:
                    rec.message = await _error_message(resp)
                    rec.outcome = "rejected" if resp.status in HTTP_REFUSALS else "error"
                    return
                rate = int(resp.headers.get("X-Sample-Rate") or self.o["sample_rate"])
                chk = self._checker(rec, t_dispatch, rate)
                chk.started = True  # the headers came with the first audio
                chk.first_audio.add(0)
                rec.started_ms = (now - t_dispatch) * 1e3
                with contextlib.suppress(ValueError):
                    rec.server_ttfa_ms = float(resp.headers["X-TTS-Ttfa-Ms"])
                buf, first = bytearray(), None
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    first = first or now
                    buf += chunk
                    n = len(buf) // chk.frame_bytes
                    if n:
                        chk.audio(self._frame(chk, bytes(buf[:n * chk.frame_bytes]), n, 0),
                                  now)
                        del buf[:n * chk.frame_bytes]
                end = time.perf_counter()
                chk.finish()
                if buf:
                    chk.bad(f"the body ends with {len(buf)} bytes, not a whole frame")
                if first is not None:  # the first bytes, not the first whole frame
                    rec.ttfa_ms = (first - t_dispatch) * 1e3
                rec.e2e_ms = (end - t_dispatch) * 1e3
                rec.outcome = "ok"
        except aiohttp.ClientPayloadError as e:  # cut off: the call failed after 200
            rec.outcome, rec.code, rec.message = "error", "HTTP_TRUNCATED", repr(e)[:300]
        except aiohttp.ClientConnectionError as e:
            rec.outcome, rec.code, rec.message = "error", "HTTP_CONNECTION", repr(e)[:300]

    async def _ws(self, p: Plan, rec: Record, t_dispatch: float) -> None:
        assert self.session is not None
        o = self.o
        try:
            ws = await self.session.ws_connect(self.url, compress=0, autoping=True)
        except aiohttp.WSServerHandshakeError as e:
            rec.code, rec.message = f"WS_HANDSHAKE_{e.status}", e.message[:300]
            rec.outcome = "rejected" if e.status in HTTP_REFUSALS else "error"
            return
        except aiohttp.ClientConnectionError as e:
            rec.outcome, rec.code, rec.message = "error", "WS_CONNECTION", repr(e)[:300]
            return
        chk = self._checker(rec, t_dispatch, int(o["sample_rate"]))
        rng = random.Random(p.piece_seed)

        async def send(msg: dict[str, Any]) -> bool:
            try:
                await ws.send_str(json.dumps(msg))
                return True
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                return False  # the server closed the socket: its close code says why

        async def drive() -> None:
            if not await send({"type": "config", "voice": p.voice, "language": p.language,
                               "sample_rate": int(o["sample_rate"]),
                               "frame_ms": self.frame_ms, "seed": p.seed,
                               "sampling": {"max_frames": p.max_frames},
                               "session_id": f"soak-ws-{p.index}",
                               "trace_id": f"soak{p.index}"}):
                return
            if o["stream_text"]:
                cut = words(p.text) if o["stream_text"] == "words" else pieces(rng, p.text)
                for piece in cut:
                    if not await send({"type": "text", "text": piece}):
                        return
                    await asyncio.sleep(o["piece_interval_ms"] / 1e3)
            elif not await send({"type": "text", "text": p.text}):
                return
            if await send({"type": "flush"}):
                await chk.ev("flushed0").wait()
                await send({"type": "end"})  # then the server closes (1000)

        driver = asyncio.create_task(drive())
        uid, error = 0, ""
        try:
            while True:
                msg = await ws.receive()
                now = time.perf_counter()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    chk.audio(self._frame(chk, msg.data, 1, uid), now)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    ev = json.loads(msg.data)
                    if ev["type"] == "error":
                        error = str(ev.get("message") or ev.get("code"))  # the close's why
                        continue
                    if ev["type"] == "first_audio":
                        uid = ev["utterance_id"]
                    elif ev["type"] in ("flushed", "truncated") and \
                            ev["utterance_id"] in chk.first_audio:
                        chk.closed_utts.add(ev["utterance_id"])  # its last frame was sent
                    chk.event(_event(ev), now)
                else:  # CLOSE (then CLOSED), or ERROR
                    break
            code = ws.close_code
            rec.code = f"WS_{code}"
            reason = msg.extra if msg.type == aiohttp.WSMsgType.CLOSE else ws.exception()
            rec.message = (error or str(reason or ""))[:300]
            rec.outcome = ("ok" if code == 1000 else
                           "rejected" if code in WS_REFUSALS else "error")
            if 0 in chk.flushed:
                rec.e2e_ms = (chk.flushed[0] - t_dispatch) * 1e3
            if rec.outcome == "ok":
                if not driver.done():
                    chk.bad("socket closed before the client's end")
                if 0 not in chk.flushed:
                    chk.bad("no flushed for the utterance")
        finally:
            await settle(chk, driver)
            await ws.close()


def _event(ev: dict[str, Any]) -> tts_pb2.Event:
    """A WS JSON event as the proto's Event (what the checker reads)."""
    e = tts_pb2.Event(type=WS_EVENTS.get(ev["type"], 0), utterance_id=ev["utterance_id"],
                      next_seq=ev["next_seq"])
    t = ev.get("timings")
    if t:
        e.timings.CopyFrom(tts_pb2.ServerTimings(
            ttfa_ms=t["ttfa_ms"], queue_ms=t["queue_ms"], prefill_ms=t["prefill_ms"],
            first_packet_ms=t["first_packet_ms"]))
    return e


async def _error_message(resp: aiohttp.ClientResponse) -> str:
    """OpenAI's error body's message (the server's words: why it refused)."""
    try:
        body = await resp.json(content_type=None)
        return str(body["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError, aiohttp.ClientError):
        return (await resp.text(errors="replace"))[:300]
