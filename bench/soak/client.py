"""The load: one process's arrivals on grpc.aio (or, `protocol` http / ws, the server's
HTTP fronts: `fronts.py`), each call's stream, its actions."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from functools import partial
from typing import Any

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from bench.soak.checker import Record, StreamChecker, settle
from bench.soak.fronts import Front
from bench.soak.grpc_fix import patch_grpc_write_status
from bench.soak.plan import Plan, pieces, words

CODEC_FRAME_S = 0.08


class Load:
    """One process's share of the arrivals: an asyncio open-loop generator."""

    def __init__(self, opts: dict[str, Any], plans: list[Plan], proc: int) -> None:
        self.o = opts
        self.plans = plans
        self.proc = proc
        self.records: list[Record] = []
        self.inflight = 0
        self.arrivals = 0
        self.counts: dict[str, int] = {}
        self.violations = 0
        self._ttfa_new: list[float] = []
        self.loop_lag_ms: list[float] = []
        self.frame_ms = int(opts["frame_ms"])
        rate = int(opts["sample_rate"])
        self.frame_bytes = rate * self.frame_ms // 1000 * 2
        self.stop_flag = False
        self.aborted = False
        self._abort: asyncio.Event | None = None

    def progress(self) -> dict[str, Any]:
        ttfa, self._ttfa_new = self._ttfa_new, []
        return {"arrivals": self.arrivals, "inflight": self.inflight,
                "counts": dict(self.counts), "violations": self.violations,
                "ttfa_new": ttfa, "cpu_s": time.process_time()}

    async def _lag_probe(self) -> None:
        period = 0.01
        while not self.stop_flag:
            t = time.perf_counter()
            await asyncio.sleep(period)
            self.loop_lag_ms.append((time.perf_counter() - t - period) * 1e3)

    def abort(self) -> None:
        """Stop dispatching and end the open calls now (SIGTERM / SIGINT)."""
        self.aborted = True
        if self._abort is not None:
            self._abort.set()

    async def run(self) -> dict[str, Any]:
        patched = patch_grpc_write_status() if self.o["grpc_write_fix"] else False
        self._abort = asyncio.Event()
        if self.aborted:
            self._abort.set()
        protocol = self.o.get("protocol", "grpc")
        n_ch = max(1, int(self.o["channels"])) if protocol == "grpc" else 0
        channels = [grpc.aio.insecure_channel(self.o["addr"], options=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.channel_id", i)])
            for i in range(n_ch)]
        calls: list[Callable[[Plan, Record, float], Awaitable[None]]] = [
            partial(self._call, tts_pb2_grpc.TextToSpeechStub(ch)) for ch in channels]
        front = Front(protocol, self.o) if protocol != "grpc" else None
        if front is not None:
            await front.open()
            calls = [front.call]
        probe = asyncio.create_task(self._lag_probe())
        aborted = asyncio.create_task(self._abort.wait())
        tasks: set[asyncio.Task[None]] = set()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in channels)),
                                   30)
            # time.monotonic is one clock for every process here (CLOCK_MONOTONIC on
            # Linux): the processes of --procs share one schedule.
            start = max(self.o["start_at"], time.monotonic() + 0.01)
            for p in self.plans:
                delay = start + p.at - time.monotonic()
                if delay > 0:
                    await asyncio.wait([aborted], timeout=delay)
                if self.aborted:
                    break
                self.arrivals += 1
                t = asyncio.create_task(self._one(calls[p.index % len(calls)], p,
                                                  start + p.at))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            deadline = time.monotonic() + self.o["drain_timeout"]
            while tasks and not self.aborted and time.monotonic() < deadline:
                await asyncio.wait({*tasks, aborted}, timeout=deadline - time.monotonic(),
                                   return_when=asyncio.FIRST_COMPLETED)
            pending = set(tasks)
            for t in pending:  # hung (or aborted): recorded by _one's CancelledError handler
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
        finally:
            self.stop_flag = True
            probe.cancel()
            aborted.cancel()
            for ch in channels:
                await ch.close()
            if front is not None:
                await front.close()
        return {"records": [asdict(r) for r in self.records],
                "loop_lag_ms": self.loop_lag_ms, "planned": len(self.plans),
                "grpc_write_fix": patched,
                "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}

    def _config(self, p: Plan) -> tts_pb2.SynthesizeRequest:
        cfg = tts_pb2.SessionConfig(voice=p.voice, language=p.language, seed=p.seed,
                                    frame_ms=self.frame_ms,
                                    frames_per_message=int(self.o["frames_per_message"]),
                                    sample_rate=int(self.o["sample_rate"]),
                                    session_id=f"soak-{self.proc}-{p.index}",
                                    trace_id=f"soak{p.index}")
        cfg.sampling.max_frames = p.max_frames
        return tts_pb2.SynthesizeRequest(config=cfg)

    async def _one(self, call: Callable[[Plan, Record, float], Awaitable[None]], p: Plan,
                   scheduled: float) -> None:
        now = time.monotonic()
        rec = Record(p.index, p.kind, len(p.text), p.max_frames,
                     dispatch_late_ms=(now - scheduled) * 1e3, dispatch_at=now,
                     voice=p.voice)
        t_dispatch = time.perf_counter()
        self.inflight += 1
        try:
            async with asyncio.timeout(self.o["call_timeout"]):
                await call(p, rec, t_dispatch)
        except TimeoutError:
            rec.outcome, rec.code = "timeout", "CLIENT_TIMEOUT"
        except asyncio.CancelledError:  # still open when the drain ended (or aborted)
            rec.outcome, rec.code = ("aborted", "ABORTED") if self.aborted else ("hung", "HUNG")
        except Exception as e:  # any client-side surprise fails the soak
            rec.outcome, rec.code, rec.message = "error", "CLIENT_EXCEPTION", repr(e)[:300]
        finally:
            rec.end_ms = (time.perf_counter() - t_dispatch) * 1e3
            self.inflight -= 1
            self.counts[rec.outcome] = self.counts.get(rec.outcome, 0) + 1
            if rec.violations:
                self.violations += 1
            if rec.ttfa_ms is not None:
                self._ttfa_new.append(rec.ttfa_ms)
            self.records.append(rec)

    async def _call(self, stub: tts_pb2_grpc.TextToSpeechStub, p: Plan, rec: Record,
                    t_dispatch: float) -> None:
        await _GrpcCall(self, stub, p, rec, t_dispatch).run()


class _GrpcCall:
    """One gRPC call of the load: its requests written one at a time (the config, the text
    whole or in pieces, FLUSH, the plan's action), its responses checked as they come
    (StreamChecker), its outcome and code in its Record."""

    def __init__(self, load: Load, stub: tts_pb2_grpc.TextToSpeechStub, p: Plan, rec: Record,
                 t_dispatch: float) -> None:
        self.o, self.p, self.rec, self.t_dispatch = load.o, p, rec, t_dispatch
        self.config = load._config(p)
        self.call = stub.Synthesize()
        self.chk = StreamChecker(rec, t_dispatch, load.frame_ms, load.frame_bytes,
                                 self.o["underrun_tolerance_ms"] / 1e3)
        self.wlock = asyncio.Lock()
        self.cancelled = False  # the plan dropped the call
        self.half_closed = False
        self.senders: list[dict[str, bool]] = []  # one abort flag per send_text
        self.rng = random.Random(p.piece_seed)

    async def run(self) -> None:
        driver = asyncio.create_task(self._drive())
        try:
            if await self._read():
                await self._judge(driver)
        except grpc.aio.AioRpcError as e:
            rec = self.rec
            if self.cancelled and e.code() == grpc.StatusCode.CANCELLED:
                rec.outcome, rec.code = "cancelled", "CANCELLED"
            else:
                rec.code = e.code().name
                rec.message = (e.details() or "")[:300]
                rec.outcome = ("rejected" if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                               else "error")
        finally:
            await settle(self.chk, driver)
            if not self.call.done():
                self.call.cancel()

    async def _read(self) -> bool:
        """The responses until the stream ends; False: the plan cancelled the call."""
        while True:
            try:
                resp = await self.call.read()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.cancelled and task is not None and not task.cancelling():
                    self.rec.outcome, self.rec.code = "cancelled", "CANCELLED"
                    return False
                raise
            if resp is grpc.aio.EOF:
                return True
            now = time.perf_counter()
            if resp.WhichOneof("response") == "audio":
                self.chk.audio(resp.audio, now)
            else:
                self.chk.event(resp.event, now)

    async def _judge(self, driver: asyncio.Task[None]) -> None:
        """The ended stream's outcome, and what a whole stream must have said."""
        rec, chk = self.rec, self.chk
        code = await self.call.code()
        rec.code = code.name
        rec.outcome = "ok" if code == grpc.StatusCode.OK else "error"
        if 0 in chk.flushed and self.p.kind == "normal":
            rec.e2e_ms = (chk.flushed[0] - self.t_dispatch) * 1e3
        if rec.outcome == "ok":
            if not driver.done():
                chk.bad("stream ended before the client half-closed")
            if rec.action in ("", "skipped") and 0 not in chk.flushed:
                chk.bad("no FLUSHED for the utterance")
            if rec.action == "stop" and chk.stopped_uid is None:
                chk.bad("no STOPPED after STOP")
            if rec.action == "reset" and chk.reset_uid is None:
                chk.bad("no RESET after RESET")

    async def _write(self, req: tts_pb2.SynthesizeRequest) -> bool:
        async with self.wlock:
            if self.half_closed or self.cancelled:
                return False
            try:
                await self.call.write(req)
                return True
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                return False  # the call has ended; its status is read by `run`

    async def _send_text(self, text: str) -> None:
        me = {"abort": False}
        self.senders.append(me)
        if self.o["stream_text"]:
            cut = words(text) if self.o["stream_text"] == "words" else pieces(self.rng, text)
            for piece in cut:
                if me["abort"]:
                    return
                if not await self._write(tts_pb2.SynthesizeRequest(
                        text=tts_pb2.TextDelta(text=piece))):
                    return
                await asyncio.sleep(self.o["piece_interval_ms"] / 1e3)
        elif not await self._write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=text))):
            return
        if not me["abort"]:
            await self._write(tts_pb2.SynthesizeRequest(
                control=tts_pb2.Control(type=tts_pb2.Control.FLUSH)))

    async def _half_close(self) -> None:
        async with self.wlock:
            if not self.half_closed and not self.cancelled:
                self.half_closed = True
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError,
                                         grpc.aio.UsageError):
                    await self.call.done_writing()

    async def _wait_any(self, *names: str, timeout: float | None = None) -> str | None:
        waits = {asyncio.ensure_future(self.chk.ev(n).wait()): n for n in names}
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return waits[next(iter(done))] if done else None

    async def _drive(self) -> None:
        p, rec = self.p, self.rec
        if not await self._write(self.config):
            return
        text_task = asyncio.create_task(self._send_text(p.text))
        try:
            if p.kind != "normal":
                if await self._wait_any("first_audio", "flushed0") != "first_audio":
                    rec.action = "skipped"
                else:
                    audio_s = p.max_frames * CODEC_FRAME_S
                    fired = await self._wait_any("flushed0", timeout=p.action_frac * audio_s)
                    if fired is not None:
                        rec.action = "skipped"  # the utterance ended first
                    else:
                        rec.action = p.kind
                        for s in self.senders:  # no more text of this utterance
                            s["abort"] = True
                        await self._act()
                        if p.kind == "cancel":
                            return
            if rec.action in ("", "skipped"):
                await self.chk.ev("flushed0").wait()
            await text_task
        finally:
            text_task.cancel()
        await self._half_close()

    async def _act(self) -> None:
        p = self.p
        if p.kind == "cancel":
            self.cancelled = True
            self.call.cancel()
            return
        ctl = tts_pb2.Control.STOP if p.kind == "stop" else tts_pb2.Control.RESET
        if not await self._write(tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=ctl))):
            return
        await self.chk.ev("stopped" if p.kind == "stop" else "reset").wait()
        if p.kind == "reset":
            t = time.perf_counter()
            await self._send_text(p.text2)
            await self.chk.ev("flushed_new").wait()
            if self.chk.new_first_frame is not None:
                self.rec.reset_ttfa_ms = (self.chk.new_first_frame - t) * 1e3


def _child(opts: dict[str, Any], plans: list[Plan], proc: int, q: Any) -> None:
    """A worker process: runs its plans, reports progress every second, then its result."""
    async def main() -> dict[str, Any]:
        load = Load(opts, plans, proc)
        for sig in (signal.SIGTERM, signal.SIGINT):  # the parent's SIGTERM, a Ctrl-C
            asyncio.get_running_loop().add_signal_handler(sig, load.abort)

        async def report() -> None:
            while True:
                await asyncio.sleep(1.0)
                q.put(("progress", proc, load.progress()))

        rep = asyncio.create_task(report())
        try:
            return await load.run()
        finally:
            rep.cancel()
            q.put(("progress", proc, load.progress()))

    try:
        res = asyncio.run(main())
        q.put(("done", proc, res))
    except BaseException as e:  # the parent fails the soak
        q.put(("crashed", proc, repr(e)))


