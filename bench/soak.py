"""Open-loop soak of the TTS gRPC service: Poisson arrivals through the real server, checked.

Requests arrive as a Poisson process at `--rate` req/s for `--duration` s (open loop: an
arrival never waits for earlier calls; design.md section 6). Each one opens a `Synthesize`
stream with a voice and language drawn from ListVoices, default sampling (EOS active) and
`sampling.max_frames` ~ the spoken length of its sentence (`--frames-per-char`, 0.9 codec
frames of 80 ms per character = ~14 characters per second), sends one English sentence of
20-220 characters whole (or, `--stream-text`, in small pieces at LLM speed), FLUSH, waits
for FLUSHED and half-closes. Shares of the calls STOP (`--stop-share`), RESET and speak a
new sentence (`--reset-share`) or drop the call (`--cancel-share`) at a random time after
their first audio.

Per call: dispatch -> SESSION_STARTED, dispatch -> first audio (client TTFA), end to end,
frames, status (OK, RESOURCE_EXHAUSTED with its latency, others), underruns (a player that
starts at an utterance's first frame plays frame k at k x frame_ms: frames that arrive
after that are late) and the stream's invariants (seq contiguous from 0, start_ms, frame
size, next_seq of events, nothing of a stopped utterance after STOPPED, FIRST_AUDIO before
an utterance's first frame, FLUSHED after its last): a violation fails the soak.

Every `--sample-every` s it logs progress and scrapes the server's /metrics (active
sessions, tts_gpu_memory_bytes) and, where there is one, nvidia-smi. At the end it checks:
no engine fault in the server log, the server alive and SERVING, tts_active_sessions back
to 0, GPU memory flat after warm-up, no broken stream, no error status, no hung call; prints
a JSON summary (also `--out`) and exits 1 if a check failed.

  # against a running server (HTTP side on its TTS_HTTP_PORT for /metrics):
  python -m bench.soak --addr 127.0.0.1:50051 --http-port 8001 --rate 20 --duration 60
  # start the server itself (its log and /metrics are read, it is stopped at the end):
  python -m bench.soak --start-server --model preset:0.6b --device cuda --max-sessions 256 \\
      --rate 100 --duration 240 --procs 4 --out soak.json --server-log soak_server.log
  # CPU, tiny random model:
  python -m bench.soak --start-server --rate 2 --duration 10 --max-sessions 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

CODEC_FRAME_S = 0.08
# Event TRUNCATED (the frame cap ended an utterance); by number, for stubs without it.
TRUNCATED = 6
# Lines of the server log that mean the engine (or the GPU) failed.
FAULT_PATTERNS = (
    "failed; ending their utterances",
    "engine step failed",
    "engine iteration failed",
    "fatal engine fault",
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "Synthesize failed",
    "on_step hook failed",
    "Traceback",
    " CRITICAL ",
)
# Any other line the server logged at ERROR (format "time LEVEL logger message").
ERROR_LEVEL = re.compile(r"^\S+ \S+ ERROR ")
_WORD_TEXT = (
    "the a an this that every some our your their one two three many few small large "
    "quick slow bright dark quiet loud early late new old simple careful happy busy "
    "morning evening river mountain city garden window kitchen station market library "
    "engineer teacher driver doctor pilot farmer writer student neighbour traveller "
    "voice signal message answer question story picture letter number minute second "
    "weather music coffee breakfast journey meeting project system network server "
    "walks runs reads writes builds finds keeps sends brings watches listens speaks "
    "opens closes carries follows answers explains remembers forgets chooses waits "
    "today tomorrow yesterday again always never often sometimes quickly slowly "
    "carefully quietly together almost really still only just also very rather "
    "with without under over through across behind beside before after around near "
    "and but so because while although when where if then"
)
WORDS = _WORD_TEXT.split()
CLOSERS = ".", ".", ".", "?", "!"


# --------------------------------------------------------------------------- helpers


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]


def dist(values: list[float], qs: tuple[float, ...] = (50, 95, 99)) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    for q in qs:
        out[f"p{q:g}"] = _r(pct(values, q))
    out["max"] = _r(max(values) if values else None)
    return out


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    """One English sentence of lo..hi characters from the word list."""
    target = rng.randint(lo, hi)
    words: list[str] = []
    n = -1  # length of " ".join(words)
    while True:
        w = rng.choice(WORDS)
        if n + len(w) + 2 > target and n + 1 >= lo:  # +1 space, +1 closing mark
            break
        if words and rng.random() < 0.12:
            words[-1] += ","
            n += 1
        words.append(w)
        n += len(w) + 1
    text = " ".join(words)
    text = text[0].upper() + text[1:] + rng.choice(CLOSERS)
    return text[:hi]


def pieces(rng: random.Random, text: str, lo: int = 1, hi: int = 6) -> list[str]:
    """Text cut like an LLM streams it: pieces of lo..hi characters."""
    out, i = [], 0
    while i < len(text):
        k = rng.randint(lo, hi)
        out.append(text[i:i + k])
        i += k
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels as written by the server)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(val)
    return out


def nvidia_smi_mb() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, check=True)
        return float(r.stdout.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def patch_grpc_write_status() -> bool:
    """Keep the server's status when a client write fails because the call just ended.

    grpc.aio (1.85 and older; grpc/grpc#36066, fix proposed in grpc/grpc#43486): when the
    server ends a bidi call before the client's write goes out (a RESOURCE_EXHAUSTED at
    admission, say), the failed write replaces the server's status with INTERNAL "Internal
    error from Core". This waits up to 5 s for the real status instead and keeps INTERNAL
    only where none comes (the hang that the INTERNAL was added for). Applied once per
    process; False (not applied) if this grpc's `_write` does not look as expected.
    """
    import inspect

    from grpc import _common
    from grpc._cython import cygrpc
    from grpc.aio import _call

    mixin = _call._StreamRequestMixin
    if getattr(mixin, "_soak_patched", False):
        return True
    try:
        src = inspect.getsource(mixin._write)
    except (OSError, TypeError):
        return False
    if "set_internal_error(str(err))" not in src or "send_serialized_message" not in src:
        return False

    async def _write(self: Any, request: Any) -> None:
        if self.done():
            raise asyncio.InvalidStateError(_call._RPC_ALREADY_FINISHED_DETAILS)
        if self._done_writing_flag:
            raise asyncio.InvalidStateError(_call._RPC_HALF_CLOSED_DETAILS)
        if not self._metadata_sent.is_set():
            await self._metadata_sent.wait()
            if self.done():
                await self._raise_for_status()
        serialized = _common.serialize(request, self._request_serializer)
        try:
            await self._cython_call.send_serialized_message(serialized)
        except cygrpc.InternalError as err:
            waiter = asyncio.ensure_future(self._cython_call.status())
            done, _ = await asyncio.wait([waiter], timeout=5.0)
            if not done:
                waiter.cancel()
                self._cython_call.set_internal_error(str(err))
            await self._raise_for_status()
        except asyncio.CancelledError:
            if not self.cancelled():
                self.cancel()
            raise

    mixin._write = _write
    mixin._soak_patched = True
    return True


# --------------------------------------------------------------------------- one call


@dataclass
class Plan:
    """What one arrival does (drawn up front from the seeded generator)."""

    index: int
    at: float                      # arrival time, seconds from the start
    kind: str                      # normal | stop | reset | cancel
    voice: str
    language: str
    seed: int
    text: str
    max_frames: int
    action_frac: float             # when the action fires, as a share of the audio
    text2: str = ""                # RESET: the new sentence
    max_frames2: int = 0
    piece_seed: int = 0


@dataclass
class Record:
    """What one call did, as the client saw it (times in ms from dispatch)."""

    index: int
    kind: str
    chars: int
    max_frames: int
    dispatch_late_ms: float = 0.0
    outcome: str = ""              # ok | rejected | cancelled | error | timeout | hung
    code: str = ""
    message: str = ""
    started_ms: float | None = None
    ttfa_ms: float | None = None
    server_ttfa_ms: float | None = None
    e2e_ms: float | None = None
    end_ms: float | None = None
    frames: int = 0
    utterances: int = 0            # utterances with audio
    truncated: int = 0             # utterances ended by the frame cap (Event TRUNCATED)
    late_frames: int = 0
    late_utterances: int = 0
    max_late_ms: float = 0.0
    action: str = ""               # stop | reset | cancel | skipped (utterance ended first)
    reset_ttfa_ms: float | None = None
    violations: list[str] = field(default_factory=list)


class StreamChecker:
    """The stream's invariants and the player's clock, fed one response at a time."""

    def __init__(self, rec: Record, t_dispatch: float, frame_ms: int, frame_bytes: int,
                 tolerance_s: float) -> None:
        self.rec = rec
        self.t0 = t_dispatch
        self.frame_s = frame_ms / 1e3
        self.frame_ms = frame_ms
        self.frame_bytes = frame_bytes
        self.tol = tolerance_s
        self.seq = 0
        self.started = False
        self.min_uid = 0               # frames below this utterance id must not come
        self.uid = -1                  # utterance of the last frame
        self.first_audio: set[int] = set()
        self.closed_utts: set[int] = set()   # last_in_utterance seen
        self.utt_start: float = 0.0
        self.utt_k = 0
        self.utt_late = 0
        self.events: dict[str, asyncio.Event] = {}
        self.flushed: dict[int, float] = {}  # utterance id -> arrival
        self.first_frame_at: dict[int, float] = {}
        self.stopped_uid: int | None = None
        self.reset_uid: int | None = None
        self.after_stop = False
        self.silent_after_stop = rec.kind == "stop"
        self.new_first_frame: float | None = None  # first frame after STOPPED/RESET

    def ev(self, name: str) -> asyncio.Event:
        e = self.events.get(name)
        if e is None:
            e = self.events[name] = asyncio.Event()
        return e

    def bad(self, what: str) -> None:
        if len(self.rec.violations) < 5:
            self.rec.violations.append(what)

    def audio(self, f: tts_pb2.AudioFrame, now: float) -> None:
        if not self.started:
            self.bad("audio before SESSION_STARTED")
        if f.seq != self.seq:
            self.bad(f"seq {f.seq}, expected {self.seq}")
            self.seq = f.seq
        if f.start_ms != f.seq * self.frame_ms:
            self.bad(f"start_ms {f.start_ms} at seq {f.seq}")
        if len(f.pcm) != self.frame_bytes:
            self.bad(f"frame of {len(f.pcm)} bytes, expected {self.frame_bytes}")
        uid = f.utterance_id
        if self.after_stop and self.silent_after_stop:
            self.bad("a frame after STOPPED (no text was sent after STOP)")
        if uid < self.min_uid:
            self.bad(f"frame of utterance {uid} after its STOPPED/RESET")
        if uid < self.uid:
            self.bad(f"utterance id went back {self.uid} -> {uid}")
        if uid in self.closed_utts:
            self.bad(f"frame of utterance {uid} after its last_in_utterance")
        if uid in self.flushed:
            self.bad(f"frame of utterance {uid} after its FLUSHED")
        if uid not in self.first_audio:
            self.bad(f"utterance {uid}: frame before FIRST_AUDIO")
            self.first_audio.add(uid)
        self.seq += 1
        self.rec.frames += 1
        if uid != self.uid:  # a player starts at the utterance's first frame
            self._close_utterance()
            self.uid, self.utt_start, self.utt_k, self.utt_late = uid, now, 0, 0
            self.first_frame_at[uid] = now
            self.rec.utterances += 1
            if self.after_stop and self.new_first_frame is None:
                self.new_first_frame = now
            if uid == 0:
                self.rec.ttfa_ms = (now - self.t0) * 1e3
                self.ev("first_audio").set()
        else:
            late = now - (self.utt_start + self.utt_k * self.frame_s)
            if late > self.tol:
                self.utt_late += 1
                self.rec.late_frames += 1
            if late * 1e3 > self.rec.max_late_ms:
                self.rec.max_late_ms = late * 1e3
        self.utt_k += 1
        if f.last_in_utterance:
            self.closed_utts.add(uid)

    def _close_utterance(self) -> None:
        if self.uid >= 0 and self.utt_late:
            self.rec.late_utterances += 1
        self.utt_late = 0

    def event(self, e: tts_pb2.Event, now: float) -> None:
        t = e.type
        if t == tts_pb2.Event.SESSION_STARTED:
            if self.started or self.seq:
                self.bad("SESSION_STARTED not first / twice")
            self.started = True
            self.rec.started_ms = (now - self.t0) * 1e3
            return
        if not self.started:
            self.bad(f"event {t} before SESSION_STARTED")
        if e.next_seq != self.seq:
            self.bad(f"event {tts_pb2.Event.Type.Name(t)} next_seq {e.next_seq}, "
                     f"{self.seq} frames sent")
        uid = e.utterance_id
        if t == tts_pb2.Event.FIRST_AUDIO:
            if uid in self.first_audio:
                self.bad(f"second FIRST_AUDIO of utterance {uid}")
            if uid < self.min_uid:
                self.bad(f"FIRST_AUDIO of utterance {uid} after its STOPPED/RESET")
            self.first_audio.add(uid)
            if uid == 0:
                self.rec.server_ttfa_ms = e.timings.ttfa_ms
        elif t == tts_pb2.Event.FLUSHED:
            if uid in self.first_audio and uid >= self.min_uid and uid not in self.closed_utts:
                self.bad(f"FLUSHED of utterance {uid} without its last_in_utterance frame")
            self.flushed[uid] = now
            self.ev(f"flushed{uid}").set()
            if self.after_stop and uid >= self.min_uid:  # the new text's utterance
                self.ev("flushed_new").set()
        elif t == TRUNCATED:  # the frame cap ended it: after its last frame
            if uid in self.first_audio and uid not in self.closed_utts:
                self.bad(f"TRUNCATED of utterance {uid} before its last_in_utterance frame")
            self.closed_utts.add(uid)
            self.rec.truncated += 1
        elif t in (tts_pb2.Event.STOPPED, tts_pb2.Event.RESET):
            # Nothing of an utterance that had begun (any frame or FIRST_AUDIO seen) may
            # follow. (Which id the event carries changed over the protocol's versions:
            # the dropped one or the next one; only the rule above is relied on.)
            seen = max(self.first_audio | self.closed_utts | {self.uid, uid - 1})
            self.min_uid = max(self.min_uid, seen + 1)
            self.after_stop = True
            if t == tts_pb2.Event.STOPPED:
                self.stopped_uid = uid
                self.ev("stopped").set()
            else:
                self.reset_uid = uid
                self.ev("reset").set()
        else:
            self.bad(f"unknown event type {t}")

    def finish(self) -> None:
        self._close_utterance()


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
        n_ch = max(1, int(self.o["channels"]))
        channels = [grpc.aio.insecure_channel(self.o["addr"], options=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.channel_id", i)])
            for i in range(n_ch)]
        stubs = [tts_pb2_grpc.TextToSpeechStub(ch) for ch in channels]
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
                t = asyncio.create_task(self._one(stubs[p.index % n_ch], p, start + p.at))
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
        return {"records": [asdict(r) for r in self.records],
                "loop_lag_ms": self.loop_lag_ms, "planned": len(self.plans),
                "grpc_write_fix": patched,
                "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}

    def _config(self, p: Plan) -> tts_pb2.SynthesizeRequest:
        cfg = tts_pb2.SessionConfig(voice=p.voice, language=p.language, seed=p.seed,
                                    frame_ms=self.frame_ms,
                                    sample_rate=int(self.o["sample_rate"]),
                                    session_id=f"soak-{self.proc}-{p.index}",
                                    trace_id=f"soak{p.index}")
        cfg.sampling.max_frames = p.max_frames
        return tts_pb2.SynthesizeRequest(config=cfg)

    async def _one(self, stub: tts_pb2_grpc.TextToSpeechStub, p: Plan, scheduled: float
                   ) -> None:
        rec = Record(p.index, p.kind, len(p.text), p.max_frames,
                     dispatch_late_ms=(time.monotonic() - scheduled) * 1e3)
        t_dispatch = time.perf_counter()
        self.inflight += 1
        try:
            async with asyncio.timeout(self.o["call_timeout"]):
                await self._call(stub, p, rec, t_dispatch)
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
        call = stub.Synthesize()
        chk = StreamChecker(rec, t_dispatch, self.frame_ms, self.frame_bytes,
                            self.o["underrun_tolerance_ms"] / 1e3)
        wlock = asyncio.Lock()
        state = {"cancelled": False, "half_closed": False}
        senders: list[dict[str, bool]] = []  # one abort flag per send_text
        rng = random.Random(p.piece_seed)

        async def write(req: tts_pb2.SynthesizeRequest) -> bool:
            async with wlock:
                if state["half_closed"] or state["cancelled"]:
                    return False
                try:
                    await call.write(req)
                    return True
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    return False  # the call has ended; its status is read below

        async def send_text(text: str) -> None:
            me = {"abort": False}
            senders.append(me)
            if self.o["stream_text"]:
                for piece in pieces(rng, text):
                    if me["abort"]:
                        return
                    if not await write(tts_pb2.SynthesizeRequest(
                            text=tts_pb2.TextDelta(text=piece))):
                        return
                    await asyncio.sleep(self.o["piece_interval_ms"] / 1e3)
            elif not await write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=text))):
                return
            if not me["abort"]:
                await write(tts_pb2.SynthesizeRequest(
                    control=tts_pb2.Control(type=tts_pb2.Control.FLUSH)))

        async def half_close() -> None:
            async with wlock:
                if not state["half_closed"] and not state["cancelled"]:
                    state["half_closed"] = True
                    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError,
                                             grpc.aio.UsageError):
                        await call.done_writing()

        async def wait_any(*names: str, timeout: float | None = None) -> str | None:
            waits = {asyncio.ensure_future(chk.ev(n).wait()): n for n in names}
            try:
                done, _ = await asyncio.wait(waits, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            return waits[next(iter(done))] if done else None

        async def drive() -> None:
            if not await write(self._config(p)):
                return
            text_task = asyncio.create_task(send_text(p.text))
            try:
                if p.kind != "normal":
                    if await wait_any("first_audio", "flushed0") != "first_audio":
                        rec.action = "skipped"
                    else:
                        audio_s = p.max_frames * CODEC_FRAME_S
                        fired = await wait_any("flushed0", timeout=p.action_frac * audio_s)
                        if fired is not None:
                            rec.action = "skipped"  # the utterance ended first
                        else:
                            rec.action = p.kind
                            for s in senders:  # no more text of this utterance
                                s["abort"] = True
                            await self._act(p, call, state, write, chk, rec, send_text)
                            if p.kind == "cancel":
                                return
                if rec.action in ("", "skipped"):
                    await chk.ev("flushed0").wait()
                await text_task
            finally:
                text_task.cancel()
            await half_close()

        driver = asyncio.create_task(drive())
        try:
            while True:
                try:
                    resp = await call.read()
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if state["cancelled"] and task is not None and not task.cancelling():
                        rec.outcome, rec.code = "cancelled", "CANCELLED"
                        return
                    raise
                if resp is grpc.aio.EOF:
                    break
                now = time.perf_counter()
                if resp.WhichOneof("response") == "audio":
                    chk.audio(resp.audio, now)
                else:
                    chk.event(resp.event, now)
            code = await call.code()
            rec.code = code.name
            rec.outcome = "ok" if code == grpc.StatusCode.OK else "error"
            if 0 in chk.flushed and p.kind == "normal":
                rec.e2e_ms = (chk.flushed[0] - t_dispatch) * 1e3
            if rec.outcome == "ok":
                if not driver.done():
                    chk.bad("stream ended before the client half-closed")
                if rec.action in ("", "skipped") and 0 not in chk.flushed:
                    chk.bad("no FLUSHED for the utterance")
                if rec.action == "stop" and chk.stopped_uid is None:
                    chk.bad("no STOPPED after STOP")
                if rec.action == "reset" and chk.reset_uid is None:
                    chk.bad("no RESET after RESET")
        except grpc.aio.AioRpcError as e:
            if state["cancelled"] and e.code() == grpc.StatusCode.CANCELLED:
                rec.outcome, rec.code = "cancelled", "CANCELLED"
            else:
                rec.code = e.code().name
                rec.message = (e.details() or "")[:300]
                rec.outcome = ("rejected" if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                               else "error")
        finally:
            chk.finish()
            if not driver.done():
                driver.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await driver
            elif not driver.cancelled() and driver.exception() is not None:
                exc = driver.exception()
                chk.bad(f"client driver failed: {exc!r}"[:200])
            if not call.done():
                call.cancel()

    async def _act(self, p: Plan, call: Any, state: dict, write: Any, chk: StreamChecker,
                   rec: Record, send_text: Any) -> None:
        if p.kind == "cancel":
            state["cancelled"] = True
            call.cancel()
            return
        ctl = tts_pb2.Control.STOP if p.kind == "stop" else tts_pb2.Control.RESET
        if not await write(tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=ctl))):
            return
        name = "stopped" if p.kind == "stop" else "reset"
        await chk.ev(name).wait()
        if p.kind == "reset":
            t = time.perf_counter()
            await send_text(p.text2)
            await chk.ev("flushed_new").wait()
            if chk.new_first_frame is not None:
                rec.reset_ttfa_ms = (chk.new_first_frame - t) * 1e3


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


# --------------------------------------------------------------------------- the server


class Server:
    """The server under test: started here (`--start-server`) or already running."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = Path(a.server_log) if a.server_log else None
        self.exit_code: int | None = None
        if a.start_server:
            port = a.grpc_port or free_port()
            self.http_port = a.http_port or free_port()
            self.addr = f"127.0.0.1:{port}"
        else:
            self.addr = a.addr
            self.http_port = a.http_port
        host = self.addr.rsplit(":", 1)[0]
        self.metrics_url = (f"http://{host}:{self.http_port}/metrics"
                            if self.http_port else None)

    def start(self) -> None:
        a = self.a
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="soak-")) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TTS_MODEL": a.model, "TTS_DEVICE": a.device,
               "TTS_MAX_SESSIONS": str(a.max_sessions), "TTS_GRPC_HOST": "127.0.0.1",
               "TTS_GRPC_PORT": self.addr.rsplit(":", 1)[1],
               "TTS_HTTP_PORT": str(self.http_port)}
        for kv in a.server_env:
            k, _, v = kv.partition("=")
            env[k] = v
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "voice_tts.server"], env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    async def health(self, timeout: float = 5.0) -> str:
        async with grpc.aio.insecure_channel(self.addr) as ch:
            try:
                r = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=timeout)
                return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.aio.AioRpcError as e:
                return f"error: {e.code().name}"

    async def wait_serving(self, timeout: float, interrupted: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if interrupted is not None and interrupted():
                raise RuntimeError("interrupted while waiting for the server")
            if not self.alive():
                raise RuntimeError(f"server exited ({self.proc.returncode}): "  # type: ignore[union-attr]
                                   f"{self.log_tail()}")
            if await self.health(timeout=1.0) == "SERVING":
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"server not SERVING in {timeout:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def metrics(self) -> dict[str, float] | None:
        if not self.metrics_url:
            return None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                return parse_metrics(r.read().decode())
        except OSError:
            return None

    def rss_mb(self) -> float | None:
        if self.proc is None:
            return None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return None

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.exit_code = -9
                return
        self.exit_code = self.proc.returncode

    def faults(self) -> dict[str, Any]:
        """Fault lines of the server log (count per pattern, the first few lines) and the
        other ERROR lines."""
        out: dict[str, Any] = {"log": None, "counts": {}, "lines": [], "errors": 0,
                               "error_lines": []}
        if not self.log_path or not self.log_path.exists():
            return out
        out["log"] = str(self.log_path)
        with open(self.log_path, errors="replace") as f:
            for line in f:
                hit = next((p for p in FAULT_PATTERNS if p in line), None)
                if hit is not None:
                    out["counts"][hit.strip()] = out["counts"].get(hit.strip(), 0) + 1
                    if len(out["lines"]) < 10:
                        out["lines"].append(line.rstrip()[:300])
                elif ERROR_LEVEL.match(line):
                    out["errors"] += 1
                    if len(out["error_lines"]) < 10:
                        out["error_lines"].append(line.rstrip()[:300])
        return out


# --------------------------------------------------------------------------- the soak


def make_plans(a: argparse.Namespace, voices: list[tuple[str, list[str]]]) -> list[Plan]:
    rng = random.Random(a.seed)
    plans: list[Plan] = []
    t = 0.0
    while True:
        t += rng.expovariate(a.rate)
        if t >= a.duration:
            break
        u = rng.random()
        kind = ("stop" if u < a.stop_share else
                "reset" if u < a.stop_share + a.reset_share else
                "cancel" if u < a.stop_share + a.reset_share + a.cancel_share else "normal")
        voice, langs = rng.choice(voices)
        text = sentence(rng, a.min_chars, a.max_chars)
        text2 = sentence(rng, a.min_chars, a.max_chars) if kind == "reset" else ""
        plans.append(Plan(
            index=len(plans), at=t, kind=kind, voice=voice, language=rng.choice(langs),
            seed=rng.randrange(2**31), text=text,
            max_frames=max(1, round(len(text) * a.frames_per_char)),
            action_frac=rng.uniform(0.05, 0.6), text2=text2,
            max_frames2=max(1, round(len(text2) * a.frames_per_char)) if text2 else 0,
            piece_seed=rng.randrange(2**31)))
    return plans


class Soak:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.server = Server(a)
        self.samples: list[dict[str, Any]] = []
        self.progress: dict[int, dict[str, Any]] = {}
        self.ttfa: list[float] = []
        self.t_start = 0.0
        self.loads: list[Load] = []
        self.children: list[Any] = []
        self.interrupted = False
        self.server_died = False

    def interrupt(self) -> None:
        """SIGTERM / SIGINT: stop the arrivals, end the open calls, still report."""
        if self.interrupted:
            return
        self.interrupted = True
        self.log("interrupted: ending the open calls, then the summary")
        self._abort_all()

    def _abort_all(self) -> None:
        for ld in self.loads:
            ld.abort()
        for p in self.children:
            if p.is_alive():
                p.terminate()

    def log(self, msg: str) -> None:
        print(f"[soak {time.perf_counter() - self.t_start:7.1f}s] {msg}", file=sys.stderr,
              flush=True)

    def _agg(self) -> dict[str, Any]:
        for i, ld in enumerate(self.loads):  # in-process load
            self._take(i, ld.progress())
        agg: dict[str, Any] = {"arrivals": 0, "inflight": 0, "violations": 0}
        counts: dict[str, int] = {}
        for p in self.progress.values():
            agg["arrivals"] += p["arrivals"]
            agg["inflight"] += p["inflight"]
            agg["violations"] += p["violations"]
            for k, v in p["counts"].items():
                counts[k] = counts.get(k, 0) + v
        agg["counts"] = counts
        return agg

    def _take(self, proc: int, p: dict[str, Any]) -> None:
        self.ttfa.extend(p.pop("ttfa_new", []))
        self.progress[proc] = p

    def gpu_sample(self, m: dict[str, float] | None) -> dict[str, float | None]:
        m = m or {}
        out: dict[str, float | None] = {
            "allocated_mb": _mb(m.get('tts_gpu_memory_bytes{kind="allocated"}')),
            "reserved_mb": _mb(m.get('tts_gpu_memory_bytes{kind="reserved"}')),
            "smi_mb": nvidia_smi_mb() if self.use_smi else None,
        }
        return out

    async def sample(self) -> dict[str, Any]:
        agg = self._agg()
        m = await asyncio.to_thread(self.server.metrics)
        gpu = await asyncio.to_thread(self.gpu_sample, m)
        c = agg["counts"]
        row = {
            "t": round(time.monotonic() - self.t_load, 2) if self.t_load else 0.0,
            "arrivals": agg["arrivals"], "inflight": agg["inflight"],
            "done": sum(c.values()), "ok": c.get("ok", 0), "rejected": c.get("rejected", 0),
            "cancelled": c.get("cancelled", 0),
            "errors": c.get("error", 0) + c.get("timeout", 0) + c.get("hung", 0),
            "violations": agg["violations"],
            "ttfa_p95_ms": _r(pct(self.ttfa, 95)),
            "active_sessions": m.get("tts_active_sessions") if m else None,
            "frames_sent": m.get("tts_frames_sent_total") if m else None,
            **gpu,
            "server_rss_mb": _r(self.server.rss_mb(), 0),
            "server_alive": self.server.alive(),
        }
        self.samples.append(row)
        return row

    async def monitor(self, done: asyncio.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.a.sample_every)
            if done.is_set():
                break
            r = await self.sample()
            if not r["server_alive"] and not self.server_died:  # nothing left to soak
                self.server_died = True
                self.log(f"the server exited (status {self.server.proc.returncode}): "  # type: ignore[union-attr]
                         "ending the load")
                self._abort_all()
            mem = next((f"{k} {r[k]:.0f} MB" for k in ("allocated_mb", "smi_mb")
                        if r.get(k) is not None), "")
            self.log(f"arrivals {r['arrivals']} inflight {r['inflight']} done {r['done']} "
                     f"(ok {r['ok']}, rejected {r['rejected']}, cancelled {r['cancelled']}, "
                     f"errors {r['errors']}, broken streams {r['violations']}) "
                     f"ttfa p95 {r['ttfa_p95_ms']} ms | server active "
                     f"{r['active_sessions']} {mem}")

    async def run(self) -> dict[str, Any]:
        a = self.a
        self.t_start = time.perf_counter()
        self.t_load = 0.0
        self.use_smi = bool(a.nvidia_smi) and nvidia_smi_mb() is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.interrupt)
        if a.start_server:
            self.server.start()
            self.log(f"started server pid {self.server.proc.pid} on {self.server.addr} "  # type: ignore[union-attr]
                     f"({a.model}, {a.device}, max_sessions {a.max_sessions}); log "
                     f"{self.server.log_path}")
        try:
            await self.server.wait_serving(a.startup_timeout, lambda: self.interrupted)
            async with grpc.aio.insecure_channel(self.server.addr) as ch:
                lv = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(
                    tts_pb2.ListVoicesRequest(), timeout=30)
            voices = [(v.name, list(v.languages) or list(lv.languages) or ["auto"])
                      for v in lv.voices]
            if a.voices:
                keep = {x.lower() for x in a.voices.split(",")}
                voices = [v for v in voices if v[0].lower() in keep]
            if not voices:
                raise RuntimeError("ListVoices gave no (selected) voice")
            a.duration_requested = a.duration
            if a.deadline:  # fit the rest into the deadline: shorten the arrivals
                left = a.deadline - (time.perf_counter() - self.t_start)
                a.drain_timeout = min(a.drain_timeout, 45.0)
                reserve = a.drain_timeout + a.settle_timeout + 20 + (5 if a.procs > 1 else 0)
                if left - reserve < a.duration:
                    a.duration = max(5.0, left - reserve)
                    self.log(f"--deadline {a.deadline:g} s: {left:.0f} s left after the "
                             f"start-up; arrivals for {a.duration:.0f} s instead of "
                             f"{a.duration_requested:g} s")
            plans = make_plans(a, voices)
            self.log(f"serving: model {lv.model}, {len(voices)} voices, languages "
                     f"{sorted({x for _, ls in voices for x in ls})}; {len(plans)} arrivals "
                     f"planned over {a.duration:g} s at {a.rate:g}/s in {a.procs} process(es)")
            result = await self._load(plans)
            return await self._finish(result, lv.model, len(plans))
        finally:
            if a.start_server:
                self.server.stop()

    async def _load(self, plans: list[Plan]) -> dict[str, Any]:
        a = self.a
        opts = {"addr": self.server.addr, "channels": a.channels, "frame_ms": a.frame_ms,
                "sample_rate": a.sample_rate, "stream_text": a.stream_text,
                "piece_interval_ms": a.piece_interval_ms, "call_timeout": a.call_timeout,
                "drain_timeout": a.drain_timeout,
                "underrun_tolerance_ms": a.underrun_tolerance_ms,
                "grpc_write_fix": a.grpc_write_fix,
                # spawned processes need a few seconds to import and connect
                "start_at": time.monotonic() + (0.05 if a.procs <= 1 else 5.0)}
        done = asyncio.Event()
        self.t_load = opts["start_at"]
        await self.sample()  # before load
        mon = asyncio.create_task(self.monitor(done))
        try:
            if a.procs <= 1:
                ld = Load(opts, plans, 0)
                self.loads.append(ld)
                if self.interrupted:
                    ld.abort()
                res = await ld.run()
                results = [res]
            else:
                results = await self._children(opts, plans)
        finally:
            done.set()
            await mon
            self.loads.clear()
        records = [r for res in results for r in res["records"]]
        return {"records": records, "procs": [
            {"cpu_s": round(res["cpu_s"], 2), "wall_s": round(res["wall_s"], 2),
             "cpu_share": round(res["cpu_s"] / max(res["wall_s"], 1e-9), 3)}
            for res in results],
            "loop_lag_ms": [x for res in results for x in res["loop_lag_ms"]],
            "grpc_write_fix": all(res.get("grpc_write_fix") for res in results),
            "crashed": [res["crashed"] for res in results if res.get("crashed")]}

    async def _children(self, opts: dict[str, Any], plans: list[Plan]) -> list[dict[str, Any]]:
        n = self.a.procs
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        share = [plans[i::n] for i in range(n)]  # round robin: each a Poisson stream at rate/n
        procs = [ctx.Process(target=_child, args=(opts, share[i], i, q), daemon=True)
                 for i in range(n)]
        self.children = procs
        for p in procs:
            p.start()
        if self.interrupted:
            self._abort_all()
        results: dict[int, dict[str, Any]] = {}
        deadline = (time.monotonic() + self.a.duration + self.a.drain_timeout + 60)
        while len(results) < n and time.monotonic() < deadline:
            try:
                kind, i, payload = await asyncio.to_thread(q.get, True, 0.5)
            except queue_mod.Empty:
                for i, p in enumerate(procs):
                    if i not in results and not p.is_alive() and p.exitcode not in (0, None):
                        results[i] = {"records": [], "loop_lag_ms": [], "cpu_s": 0.0,
                                      "wall_s": 1.0, "crashed": f"exit code {p.exitcode}"}
                continue
            if kind == "progress":
                self._take(i, payload)
            elif kind == "done":
                results[i] = payload
            else:
                results[i] = {"records": [], "loop_lag_ms": [], "cpu_s": 0.0, "wall_s": 1.0,
                              "crashed": payload}
        for i, p in enumerate(procs):
            p.join(5)
            if p.is_alive():
                p.kill()
            if i not in results:
                results[i] = {"records": [], "loop_lag_ms": [], "cpu_s": 0.0, "wall_s": 1.0,
                              "crashed": "no result before the deadline"}
        return [results[i] for i in range(n)]

    async def _finish(self, load: dict[str, Any], model: str, planned: int) -> dict[str, Any]:
        a = self.a
        recs = load["records"]
        if a.records:
            Path(a.records).parent.mkdir(parents=True, exist_ok=True)
            with open(a.records, "w") as f:
                for r in sorted(recs, key=lambda r: r["index"]):
                    f.write(json.dumps(r) + "\n")
        # Slots: tts_active_sessions back to 0 once every call has ended.
        active = None
        settle = time.monotonic() + a.settle_timeout
        while True:
            m = await asyncio.to_thread(self.server.metrics)
            active = m.get("tts_active_sessions") if m else None
            if active is None or active == 0 or time.monotonic() > settle:
                break
            await asyncio.sleep(0.2)
        final = await self.sample()
        alive = self.server.alive()
        health = await self.server.health()
        metrics_end = await asyncio.to_thread(self.server.metrics) or {}
        if a.start_server:
            self.server.stop()
        faults = self.server.faults()

        by_outcome: dict[str, int] = {}
        by_code: dict[str, int] = {}
        for r in recs:
            by_outcome[r["outcome"]] = by_outcome.get(r["outcome"], 0) + 1
            by_code[r["code"]] = by_code.get(r["code"], 0) + 1
        admitted = [r for r in recs if r["outcome"] not in ("rejected",)
                    and r["started_ms"] is not None]
        rejected = [r for r in recs if r["outcome"] == "rejected"]
        utts = sum(r["utterances"] for r in recs)
        late_utts = sum(r["late_utterances"] for r in recs)
        frames = sum(r["frames"] for r in recs)
        late_frames = sum(r["late_frames"] for r in recs)
        broken = [r for r in recs if r["violations"]]
        errors = [r for r in recs if r["outcome"] in ("error", "timeout", "hung")]
        actions: dict[str, dict[str, int]] = {}
        for r in recs:
            if r["kind"] != "normal":
                d = actions.setdefault(r["kind"], {"planned": 0, "done": 0, "skipped": 0})
                d["planned"] += 1
                if r["action"] == r["kind"]:
                    d["done"] += 1
                elif r["action"] == "skipped":
                    d["skipped"] += 1
        dl = [r["dispatch_late_ms"] for r in recs]
        lag = load["loop_lag_ms"]
        ttfa = [r["ttfa_ms"] for r in admitted if r["ttfa_ms"] is not None]
        ttfa_p95 = pct(ttfa, 95)

        # GPU memory: the first sample after warm-up against the last one (calls ended).
        warm = a.warmup if a.warmup is not None else min(30.0, max(2.0, 0.2 * a.duration))
        gpu: dict[str, Any] = {"warmup_s": warm}
        for key in ("allocated_mb", "reserved_mb", "smi_mb"):
            series = [s for s in self.samples if s.get(key) is not None]
            after = next((s for s in series if s["t"] >= warm), None)
            if after is None or final.get(key) is None:
                continue
            gpu[key] = {"after_warmup": after[key], "last": final[key],
                        "max": max(s[key] for s in series),
                        "growth": round(final[key] - after[key], 1)}
        gate_key = next((k for k in ("allocated_mb", "smi_mb") if k in gpu), None)

        checks: dict[str, dict[str, Any]] = {}

        def check(name: str, ok: bool | None, **detail: Any) -> None:
            checks[name] = {"pass": ok, **detail}

        check("engine_faults", not faults["counts"] if faults["log"] else None,
              log=faults["log"], counts=faults["counts"], lines=faults["lines"])
        check("no_error_logs", None if not faults["log"] or a.allow_error_logs
              else not faults["errors"], errors=faults["errors"], lines=faults["error_lines"])
        check("server_alive", alive, health=health,
              exit_code=None if alive else self.server.proc.returncode)  # type: ignore[union-attr]
        check("server_serving", health == "SERVING", health=health)
        check("no_leaked_slots", None if active is None else active == 0,
              active_sessions=active)
        check("gpu_memory_flat",
              None if gate_key is None else gpu[gate_key]["growth"] <= a.gpu_mem_growth_mb,
              source=gate_key, bound_mb=a.gpu_mem_growth_mb,
              growth_mb=gpu[gate_key]["growth"] if gate_key else None)
        check("streams_intact", not broken, broken=len(broken),
              examples=[{"index": r["index"], "kind": r["kind"], "violations": r["violations"]}
                        for r in broken[:5]])
        check("no_errors", not errors, errors=len(errors),
              examples=[{"index": r["index"], "outcome": r["outcome"], "code": r["code"],
                         "message": r["message"]} for r in errors[:5]])
        check("all_calls_accounted",
              None if self.interrupted or self.server_died
              else len(recs) == planned and not load["crashed"],
              planned=planned, recorded=len(recs), crashed=load["crashed"])
        if self.interrupted:
            check("not_interrupted", False, note="SIGTERM/SIGINT before the end: partial")
        if a.start_server:
            check("clean_shutdown", self.server.exit_code == 0,
                  exit_code=self.server.exit_code)
        underrun_free = late_frames == 0
        capacity = {"ttfa_p95_le_100ms": ttfa_p95 is not None and ttfa_p95 <= 100.0,
                    "zero_underruns": underrun_free}
        capacity["met"] = all(capacity.values())
        if a.gate_capacity:
            check("capacity", capacity["met"], **capacity)
        failures = [f"{k}: {json.dumps({x: y for x, y in v.items() if x != 'pass'})[:400]}"
                    for k, v in checks.items() if v["pass"] is False]
        cpu_shares = [p["cpu_share"] for p in load["procs"]]
        client_lagging = bool((pct(dl, 99) or 0) > a.client_lag_warn_ms
                              or (pct(lag, 99) or 0) > a.client_lag_warn_ms
                              or any(s > 0.9 for s in cpu_shares))

        def mval(prefix: str) -> dict[str, float]:
            return {k: v for k, v in metrics_end.items() if k.startswith(prefix)}

        step_n = metrics_end.get("tts_engine_step_seconds_count") or 0
        batch_n = metrics_end.get("tts_engine_batch_size_count") or 0
        return {
            "pass": not failures,
            "failures": failures,
            "rate": a.rate, "duration_s": round(a.duration, 1),
            "duration_requested_s": a.duration_requested, "seed": a.seed, "procs": a.procs,
            "server": {"addr": self.server.addr, "model": model,
                       "started_here": a.start_server,
                       **({"device": a.device, "max_sessions": a.max_sessions}
                          if a.start_server else {})},
            "load": {"stream_text": a.stream_text, "frames_per_char": a.frames_per_char,
                     "chars": [a.min_chars, a.max_chars], "frame_ms": a.frame_ms,
                     "sample_rate": a.sample_rate, "stop_share": a.stop_share,
                     "reset_share": a.reset_share, "cancel_share": a.cancel_share},
            "arrivals": len(recs),
            "achieved_rate": round(len(recs) / a.duration, 3),
            "counts": by_outcome,
            "by_code": by_code,
            "actions": actions,
            "ttfa_ms": dist(ttfa),
            "session_started_ms": dist([r["started_ms"] for r in admitted]),
            "server_ttfa_ms": dist([r["server_ttfa_ms"] for r in admitted
                                    if r["server_ttfa_ms"] is not None]),
            "e2e_ms": dist([r["e2e_ms"] for r in recs if r["e2e_ms"] is not None]),
            "reset_ttfa_ms": dist([r["reset_ttfa_ms"] for r in recs
                                   if r["reset_ttfa_ms"] is not None]),
            "truncated_utterances": sum(r["truncated"] for r in recs),
            "no_audio_calls": sum(1 for r in admitted if r["outcome"] == "ok"
                                  and r["frames"] == 0),
            "frames": frames, "audio_s": round(frames * a.frame_ms / 1e3, 1),
            "underruns": {
                "tolerance_ms": a.underrun_tolerance_ms,
                "late_frames": late_frames, "frames": frames,
                "late_frame_share": _r(late_frames / frames, 5) if frames else None,
                "utterances_with_underrun": late_utts, "utterances": utts,
                "utterance_share": _r(late_utts / utts, 4) if utts else None,
                "max_late_ms": _r(max((r["max_late_ms"] for r in recs), default=0.0)),
                "call_max_late_ms": dist([r["max_late_ms"] for r in recs if r["frames"]]),
            },
            "rejections": {"n": len(rejected),
                           "latency_ms": dist([r["end_ms"] for r in rejected], (50, 95))},
            "capacity_gate": capacity,
            "client": {
                "dispatch_late_ms": dist(dl, (50, 99)),
                "loop_lag_ms": dist(lag, (50, 99)),
                "procs": load["procs"],
                "grpc_write_fix": load["grpc_write_fix"],
                "lagging": client_lagging,
                "note": ("client-side lag can show up as TTFA and underruns: use --procs"
                         if client_lagging else ""),
            },
            "gpu_memory_mb": gpu,
            "server_metrics_end": {
                "active_sessions": metrics_end.get("tts_active_sessions"),
                "frames_sent": metrics_end.get("tts_frames_sent_total"),
                "flow_control_pauses": metrics_end.get("tts_flow_control_pauses_total"),
                "errors": mval("tts_errors_total{"),
                "utterances": mval("tts_utterances_total{"),
                "steps": step_n,
                "step_ms_mean": _r(1e3 * metrics_end.get("tts_engine_step_seconds_sum", 0)
                                   / step_n) if step_n else None,
                "batch_mean": _r(metrics_end.get("tts_engine_batch_size_sum", 0) / batch_n)
                if batch_n else None,
            },
            "server_rss_mb": {"first": self.samples[0].get("server_rss_mb"),
                              "last": final.get("server_rss_mb")},
            "checks": checks,
            "samples": self.samples,
        }


def _mb(b: float | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--addr", default="127.0.0.1:50051",
                   help="gRPC address of a running server (ignored with --start-server)")
    g.add_argument("--http-port", type=int, default=None,
                   help="the server's TTS_HTTP_PORT for /metrics (running server: default "
                   "8001, 0 = no metrics; --start-server: a free port)")
    g.add_argument("--start-server", action="store_true",
                   help="start `python -m voice_tts.server` here, read its log, stop it")
    g.add_argument("--model", default=os.environ.get("TTS_MODEL", "preset:tiny"),
                   help="TTS_MODEL of the started server (default %(default)s)")
    g.add_argument("--device", default=os.environ.get("TTS_DEVICE", "cpu"),
                   help="TTS_DEVICE of the started server (default %(default)s)")
    g.add_argument("--max-sessions", type=int, default=64,
                   help="TTS_MAX_SESSIONS of the started server (default %(default)s)")
    g.add_argument("--grpc-port", type=int, default=0, help="started server: 0 = a free port")
    g.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra env of the started server (repeatable)")
    g.add_argument("--server-log", default=None,
                   help="started server: write its log here; running server: scan this "
                   "log for engine faults")
    g.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds for the server to report SERVING")
    g = p.add_argument_group("load")
    g.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    g.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--frames-per-char", type=float, default=0.9,
                   help="sampling.max_frames = chars x this (0.9 x 80 ms = ~14 chars/s)")
    g.add_argument("--min-chars", type=int, default=20)
    g.add_argument("--max-chars", type=int, default=220)
    g.add_argument("--voices", default="", help="comma list to restrict the voices drawn")
    g.add_argument("--stream-text", action="store_true",
                   help="send the text in 1-6 character pieces (LLM speed) instead of whole")
    g.add_argument("--piece-interval-ms", type=float, default=20.0,
                   help="--stream-text: time between pieces (20 ms = 50 tokens/s)")
    g.add_argument("--stop-share", type=float, default=0.1,
                   help="share of calls that STOP after their first audio")
    g.add_argument("--reset-share", type=float, default=0.1,
                   help="share of calls that RESET after their first audio and speak a "
                   "second sentence")
    g.add_argument("--cancel-share", type=float, default=0.1,
                   help="share of calls that the client drops after their first audio")
    g.add_argument("--frame-ms", type=int, default=20)
    g.add_argument("--sample-rate", type=int, default=24000)
    g = p.add_argument_group("client")
    g.add_argument("--procs", type=int, default=1,
                   help="client processes (the load is split; use 2-4+ at 100+ req/s)")
    g.add_argument("--channels", type=int, default=2,
                   help="gRPC channels (TCP connections) per client process")
    g.add_argument("--no-grpc-write-fix", dest="grpc_write_fix", action="store_false",
                   help="do not patch grpc.aio's status-masking write (grpc/grpc#36066): "
                   "a call the server ends early may then read INTERNAL 'Internal error "
                   "from Core' instead of its status")
    g.add_argument("--deadline", type=float, default=None,
                   help="seconds for the whole run (server start-up included): the "
                   "arrivals are cut short so that drain, checks and summary fit in it")
    g.add_argument("--call-timeout", type=float, default=180.0,
                   help="a call open longer than this fails the soak")
    g.add_argument("--drain-timeout", type=float, default=120.0,
                   help="after the last arrival, seconds for open calls to end (then: hung)")
    g = p.add_argument_group("checks and output")
    g.add_argument("--underrun-tolerance-ms", type=float, default=0.0,
                   help="a frame later than this behind the player counts as an underrun")
    g.add_argument("--warmup", type=float, default=None,
                   help="GPU memory baseline: first sample after this many seconds of load "
                   "(default 20%% of --duration, 2-30 s)")
    g.add_argument("--gpu-mem-growth-mb", type=float, default=64.0,
                   help="allowed GPU memory growth from after warm-up to the end")
    g.add_argument("--no-nvidia-smi", dest="nvidia_smi", action="store_false",
                   help="do not sample nvidia-smi")
    g.add_argument("--allow-error-logs", action="store_true",
                   help="server log lines at ERROR (other than the engine faults) do not "
                   "fail the soak (they are still counted)")
    g.add_argument("--settle-timeout", type=float, default=15.0,
                   help="seconds for tts_active_sessions to return to 0 after the calls")
    g.add_argument("--sample-every", type=float, default=5.0, help="progress/metrics period")
    g.add_argument("--client-lag-warn-ms", type=float, default=20.0,
                   help="p99 dispatch lateness or loop lag above this flags the client")
    g.add_argument("--gate-capacity", action="store_true",
                   help="also fail unless p95 TTFA <= 100 ms and zero underruns")
    g.add_argument("--out", default=None, help="write the JSON summary here too")
    g.add_argument("--records", default=None,
                   help="write every call's record here (JSON lines)")
    g.add_argument("--no-samples", action="store_true",
                   help="leave the periodic samples out of the printed summary (kept in --out)")
    a = p.parse_args(argv)
    if a.http_port is None:
        a.http_port = 0 if a.start_server else 8001
    if a.rate <= 0 or a.duration <= 0:
        p.error("--rate and --duration must be > 0")
    if not 1 <= a.min_chars <= a.max_chars:
        p.error("need 1 <= --min-chars <= --max-chars")
    if a.stop_share + a.reset_share + a.cancel_share > 1:
        p.error("--stop-share + --reset-share + --cancel-share must be <= 1")
    return a


def headline(s: dict[str, Any]) -> str:
    """The summary's key numbers on one line."""
    t, u, c = s["ttfa_ms"], s["underruns"], s["client"]
    rj = s["rejections"]["latency_ms"]
    gate = s["checks"]["gpu_memory_flat"]
    return (f"rate {s['rate']:g}/s for {s['duration_s']:g} s: {s['arrivals']} calls "
            f"{json.dumps(s['counts'])}; client TTFA p50/p95/p99 {t['p50']}/{t['p95']}/"
            f"{t['p99']} ms; underruns {u['late_frames']}/{u['frames']} frames, "
            f"{u['utterances_with_underrun']}/{u['utterances']} utterances (max "
            f"{u['max_late_ms']} ms); rejections {s['rejections']['n']} (p50/p95/max "
            f"{rj['p50']}/{rj['p95']}/{rj['max']} ms); client p99 dispatch lateness "
            f"{c['dispatch_late_ms']['p99']} ms, loop lag {c['loop_lag_ms']['p99']} ms"
            f"{' (CLIENT LAGGING)' if c['lagging'] else ''}; GPU memory growth "
            f"{gate['growth_mb']} MB ({gate['source']})")


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        summary = asyncio.run(Soak(a).run())
    except Exception as e:  # no soak at all (the server did not start, say): say so in --out
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"pass": False, "failures": [
                f"soak did not run: {e!r}"[:2000]], "rate": a.rate}, indent=1) + "\n")
        print(f"soak FAILED: {e!r}"[:4000], file=sys.stderr, flush=True)
        sys.exit(2)
    text = json.dumps(summary, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    shown = {k: v for k, v in summary.items() if k != "samples"} if a.no_samples else summary
    print(json.dumps(shown, indent=1), flush=True)
    print("soak: " + headline(summary), file=sys.stderr, flush=True)
    print(f"soak {'PASSED' if summary['pass'] else 'FAILED'}"
          + ("" if summary["pass"] else ": " + "; ".join(summary["failures"])),
          file=sys.stderr, flush=True)
    sys.exit(0 if summary["pass"] else 1)


if __name__ == "__main__":
    main()
