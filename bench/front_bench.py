"""The TTS server front under load, with no model: can one asyncio process write one gRPC
message per 20 ms frame of every stream, and does admission say no in time?

The real front (Synthesis, admission, stream.py, framing, grpc.aio on localhost: server.py's
`start_server`) runs in its own process on CPU 0, fed at the engine boundary by
`FakeFastEngine` (bench/fake_engine.py: a STAND-IN that emits noise packets at a modelled
step rate). Clients are grpc.aio processes on the other CPUs (`--client-procs`), reading
responses as raw bytes so that their own cost stays small.

closed (default): for each level of --streams, that many streams start together, each
  one utterance of --frames codec frames; the stand-in steps at --period-ms (fixed: a
  fast engine). Reported: frames/s the front delivered, its CPU (all its threads but the
  stand-in's) per message, event-loop lag, client TTFA, and per stream the lateness of
  frame k against a player started at the first frame (k x 20 ms): underruns.
open: Poisson arrivals at --rate req/s for --seconds, each one utterance of --frames;
  the stand-in's step takes --base-ms + --per-row-ms x batch, so it has a capacity that
  admission must learn from its step stats. Reported: admitted / rejected, rejection
  latency, admitted streams' TTFA and underruns.

  python -m bench.front_bench --streams 64,128,256
  python -m bench.front_bench --streams 256 --period-ms 4 --frames 60     # saturate it
  python -m bench.front_bench --mode open --rate 50 --per-row-ms 0.32     # 2x capacity
  python -m bench.front_bench --mode open --rate 50 --per-row-ms 0.32 --margin 0  # no admission
  python -m bench.front_bench --streams 128 --profile front.prof         # cProfile, loop
  python -m bench.front_bench --streams 128,256 --pace-lead 0             # no pacing
  python -m bench.front_bench --streams 128 --protocol ws                 # WebSocket

--protocol ws: the same calls over the WebSocket `/v1/audio/speech/stream` (aiohttp clients;
one binary message a 20 ms frame; the gRPC front processes do not serve it, so its whole
protocol cost is in the engine's process, which `cpu_us_per_frame` measures).

The server paces frames to real time plus TTS_PACE_LEAD_S (`--pace-lead`, the server's
default unless given): with it a closed level lasts the audio's length, not the stand-in's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from typing import Any

FRAME_MS = 20
SYNTH = "/voice.tts.v1.TextToSpeech/Synthesize"
TEXT = "The front must keep up with its own message rate, frame after frame."


# -- server process -------------------------------------------------------------------------
def serve(args: argparse.Namespace) -> None:
    """Runs the real front on the stand-in; answers 'mark' / 'report' / 'quit' on stdin."""
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.loop == "uvloop":  # as `python -m voice_tts.server` runs (TTS_UVLOOP)
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(args))
    else:
        asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    engine, settings, running = await _start_front(args)
    window = _Window(args, engine, running)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    while True:
        line = (await reader.readline()).decode().strip()
        if line == "mark":
            window.mark()
        elif line == "report":
            print(json.dumps({**window.report(), "pace_lead_s": settings.pace_lead_s}),
                  flush=True)
        else:
            break
    window.monitor.cancel()
    running.calls.draining = True
    if running.fronts is not None:
        await running.fronts.stop()
    await running.server.stop(0)
    engine.shutdown()


async def _start_front(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The real front on the stand-in engine: (engine, settings, the running server)."""
    from voice_tts.server.server import start_server
    from voice_tts.settings import TTSSettings

    from bench.fake_engine import FakeFastEngine

    engine = FakeFastEngine(max_sessions=args.max_sessions, base_ms=args.base_ms,
                            per_row_ms=args.per_row_ms, default_frames=args.frames)
    first, later = (int(x) for x in args.admit_packets.split(","))
    pace = {} if args.pace_lead is None else {"pace_lead_s": args.pace_lead}
    settings = TTSSettings(grpc_host="127.0.0.1", grpc_port=args.port,
                           http_port=args.http_port,
                           front_procs=args.front_procs,
                           max_sessions=args.max_sessions, admit_margin=args.margin,
                           first_packet_frames=first, packet_frames=later,
                           log_level="WARNING", **pace)
    running = await start_server(settings, engine=engine)  # type: ignore[arg-type]
    if running.fronts is not None:  # one CPU each after the engine process's CPU 0
        ncpu = os.cpu_count() or 2
        for i, p in enumerate(running.fronts.procs):
            os.sched_setaffinity(p.pid, {1 + i % max(1, ncpu - 1)})
    return engine, settings, running


class _Window:
    """One measured window of the serving process, from `mark` to `report`: the front's
    CPU (the process's less the stand-in engine thread's), frames sent, how late the loop
    runs a 10 ms timer, admission refusals; and, asked for, its stalls' stacks and a
    profile."""

    def __init__(self, args: argparse.Namespace, engine: Any, running: Any) -> None:
        loop = asyncio.get_running_loop()
        self.engine, self.running = engine, running
        self.metrics = running.calls.metrics
        self.lags: list[float] = []
        self.monitor = asyncio.create_task(self._lag_monitor(loop))
        self.stalls = None
        if args.stall_stacks:
            from bench.loop_stalls import LoopStalls

            self.stalls = LoopStalls(loop)
        self.profile_path = args.profile
        self.prof = None
        if args.profile:
            import cProfile

            self.prof = cProfile.Profile()
        self.start: dict[str, float] = {}

    async def _lag_monitor(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(0.01)
            self.lags.append((loop.time() - t - 0.01) * 1e3)

    def _snapshot(self, start: bool) -> dict[str, float]:
        # Both CPU clocks in ns, the process's read before the engine thread's at the start
        # of a window and after it at its end: the thread's window then lies inside the
        # process's, and their difference (the front's CPU) is never negative.
        wall = time.perf_counter()
        if start:
            cpu, engine_cpu = time.process_time(), self.engine.thread_cpu_s()
        else:
            engine_cpu = self.engine.thread_cpu_s()
            cpu = time.process_time()
        return {"wall": wall, "cpu": cpu, "engine_cpu": engine_cpu,
                "frames": self.metrics.frames_sent._value.get(), "steps": self.engine.steps}

    def mark(self) -> None:
        self.start = self._snapshot(start=True)
        self.lags.clear()
        if self.stalls is not None:
            self.stalls.clear()
        if self.prof is not None:
            self.prof.enable()

    def report(self) -> dict[str, Any]:
        if self.prof is not None:
            self.prof.disable()
            self.prof.dump_stats(self.profile_path)
        now = self._snapshot(start=False)
        d = {k: now[k] - self.start[k] for k in now}
        front_cpu = d["cpu"] - d["engine_cpu"]
        rej = {s.labels["reason"]: s.value for m in self.metrics.admission_rejected.collect()
               for s in m.samples if s.name.endswith("_total")}
        lag = sorted(self.lags) or [0.0]
        return {
            "window_s": d["wall"], "frames": d["frames"],
            "frames_per_s": d["frames"] / d["wall"],
            "front_cpu_s": front_cpu, "front_cpu_share": front_cpu / d["wall"],
            "cpu_us_per_frame": front_cpu / max(1, d["frames"]) * 1e6,
            "standin_cpu_s": d["engine_cpu"], "steps": d["steps"],
            "loop_lag_ms_p50": lag[len(lag) // 2],
            "loop_lag_ms_p99": lag[int(len(lag) * 0.99)], "loop_lag_ms_max": lag[-1],
            "rejected": rej,
            "model_points": [(round(b, 1), round(p, 2)) for b, p in
                             self.running.calls.admission.model.points()],
            **({"stalls": self.stalls.report()} if self.stalls is not None else {}),
        }


# -- client processes -----------------------------------------------------------------------
def client_proc(job: dict, out: Any) -> None:
    if job["cpus"]:
        os.sched_setaffinity(0, set(job["cpus"]))
    out.put(asyncio.run(_client(job)))


def _frames(raw: bytes) -> int:
    """An AudioFrame message's frame count (field 6; absent: 1), read off the raw bytes."""
    from voice.tts.v1 import tts_pb2

    msg = tts_pb2.SynthesizeResponse.FromString(raw)
    return msg.audio.frames or 1


class _Player:
    """A player started at a stream's first frame: how late each frame came against it
    (frame k is due k x 20 ms after the first)."""

    def __init__(self) -> None:
        self.k, self.first, self.max_late, self.late = 0, 0.0, -1e9, 0

    def arrived(self, r: dict, t_text: float, frames: int = 1) -> None:
        now = time.perf_counter()
        if self.k == 0:
            self.first = now
            r["ttfa_ms"] = (now - t_text) * 1e3
        lateness = now - (self.first + self.k * FRAME_MS / 1e3)
        self.max_late = max(self.max_late, lateness)
        self.late += lateness > 0.0
        self.k += frames

    def report(self, r: dict, t0: float) -> None:
        r.update(frames=self.k, max_late_ms=self.max_late * 1e3, late_frames=self.late,
                 e2e_s=time.perf_counter() - t0)


async def _one_call(ch: Any, job: dict, i: int) -> dict:
    import grpc
    from voice.tts.v1 import tts_pb2

    cfg = tts_pb2.SessionConfig(voice="vivian", seed=i, frame_ms=FRAME_MS,
                                frames_per_message=job["frames_per_message"])
    cfg.sampling.max_frames = job["frames"]
    call = ch.stream_stream(SYNTH, request_serializer=tts_pb2.SynthesizeRequest
                            .SerializeToString, response_deserializer=None)()
    r: dict[str, Any] = {"status": "OK"}
    t0 = time.perf_counter()
    try:
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        started = await call.read()
        if started is grpc.aio.EOF:  # rejected: the status follows
            r.update(status=(await call.code()).name, details=await call.details(),
                     reject_ms=(time.perf_counter() - t0) * 1e3)
            return r
        t_text = time.perf_counter()
        await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=TEXT)))
        await call.done_writing()
        player = _Player()
        while (raw := await call.read()) is not grpc.aio.EOF:
            if raw[0] != 0x0A:  # field 1 (AudioFrame), else an Event
                continue
            player.arrived(r, t_text, 1 if job["frames_per_message"] == 1 else _frames(raw))
        player.report(r, t0)
    except grpc.aio.AioRpcError as e:
        r.update(status=e.code().name, reject_ms=(time.perf_counter() - t0) * 1e3,
                 details=e.details())
    return r


async def _one_ws_call(http: Any, job: dict, i: int) -> dict:
    """`_one_call` over the WebSocket: config, `started`, the text and `end`, then binary
    frames until the server closes; a refusal is an `error` event and close 1013."""
    import aiohttp

    r: dict[str, Any] = {"status": "OK"}
    t0 = time.perf_counter()
    async with http.ws_connect(f"{job['http']}/v1/audio/speech/stream") as ws:
        await ws.send_json({"type": "config", "voice": "vivian", "seed": i,
                            "frame_ms": FRAME_MS, "sampling": {"max_frames": job["frames"]}})
        player, t_text = _Player(), 0.0
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                if ev["type"] == "started":
                    t_text = time.perf_counter()
                    await ws.send_json({"type": "text", "text": TEXT})
                    await ws.send_json({"type": "end"})
                elif ev["type"] == "error":
                    r.update(status=ev.get("code", "error").upper(), details=ev.get("message"),
                             reject_ms=(time.perf_counter() - t0) * 1e3)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                player.arrived(r, t_text)
    if ws.close_code == 1013:
        r["status"] = "RESOURCE_EXHAUSTED"
    elif ws.close_code != 1000 and r["status"] == "OK":
        r["status"] = f"close {ws.close_code}"
    if r["status"] == "OK":
        player.report(r, t0)
    return r


async def _client(job: dict) -> list[dict]:
    if job["protocol"] == "ws":
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            return await _calls(job, [http], _one_ws_call)
    import grpc

    per_channel = job["per_channel"]
    n_ch = max(1, math.ceil(job["streams"] / per_channel)) if job["mode"] == "closed" else \
        max(1, 128 // per_channel)
    channels = [grpc.aio.insecure_channel(job["addr"]) for _ in range(n_ch)]
    for ch in channels:
        await ch.channel_ready()
    try:
        return await _calls(job, channels, _one_call)
    finally:
        for ch in channels:
            await ch.close()


async def _calls(job: dict, conns: list[Any], one: Any) -> dict:
    """The job's calls (closed: all at once; open: Poisson arrivals), over `conns` in
    turn."""
    n_ch = len(conns)
    await asyncio.sleep(max(0.0, job["start_at"] - time.time()))
    t0, cpu0 = time.perf_counter(), time.process_time()
    if job["mode"] == "closed":
        tasks = [asyncio.create_task(one(conns[i % n_ch], job, job["first_id"] + i))
                 for i in range(job["streams"])]
    else:
        rng = random.Random(job["first_id"])
        tasks, t, end = [], time.time(), job["start_at"] + job["seconds"]
        i = 0
        while True:
            t += rng.expovariate(job["rate"])
            if t >= end:
                break
            await asyncio.sleep(max(0.0, t - time.time()))
            tasks.append(asyncio.create_task(
                one(conns[i % n_ch], job, job["first_id"] + i)))
            i += 1
    res = await asyncio.gather(*tasks)
    return {"calls": res, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - t0}


# -- driver ---------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def run_level(args: argparse.Namespace, streams: int, port: int) -> dict:
    """One level: the serving process and its clients, measured over one window."""
    http_port = _free_port() if args.protocol == "ws" else 0
    srv = subprocess.Popen(_serve_cmd(args, streams, port, http_port), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None and srv.stdin is not None
        line = srv.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"server did not start: {line!r}")
        results, client_cpu, server = _measure(args, srv, streams, port, http_port)
        srv.stdin.write("quit\n")
        srv.stdin.flush()
        srv.wait(10)
    finally:
        if srv.poll() is None:
            srv.kill()
    return _summary(args, streams, results, client_cpu, server)


def _serve_cmd(args: argparse.Namespace, streams: int, port: int, http_port: int) -> list[str]:
    """The serving process (`_serve`) on CPU 0, the level's engine stand-in."""
    max_sessions = args.max_sessions or (streams + 16 if args.mode == "closed" else 4096)
    base = args.period_ms if args.mode == "closed" else args.base_ms
    per_row = 0.0 if args.mode == "closed" else args.per_row_ms
    cmd = [sys.executable, "-m", "bench.front_bench", "_serve", "--port", str(port),
           "--max-sessions", str(max_sessions), "--margin", str(args.margin),
           "--base-ms", str(base), "--per-row-ms", str(per_row), "--frames", str(args.frames),
           "--cpus", "0"]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.stall_stacks:
        cmd += ["--stall-stacks"]
    cmd += ["--loop", args.loop, "--admit-packets", args.admit_packets]
    if args.pace_lead is not None:
        cmd += ["--pace-lead", str(args.pace_lead)]
    return [*cmd, "--front-procs", str(args.front_procs), "--http-port", str(http_port)]


def _measure(args: argparse.Namespace, srv: subprocess.Popen, streams: int, port: int,
             http_port: int) -> tuple[list[dict], float, dict]:
    """The client processes' calls over one window the server measures: (the calls,
    the clients' CPU seconds, the server's report)."""
    assert srv.stdout is not None and srv.stdin is not None
    ncpu = os.cpu_count() or 2
    client_cpus = list(range(1 + args.front_procs, ncpu)) or list(range(1, ncpu)) or [0]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    start_at = time.time() + 2.0
    n = args.client_procs
    for j in range(n):
        job = {"addr": f"127.0.0.1:{port}", "mode": args.mode, "frames": args.frames,
               "streams": streams // n + (j < streams % n), "first_id": j * 1_000_000,
               "rate": args.rate / n, "seconds": args.seconds, "start_at": start_at,
               "cpus": client_cpus, "per_channel": args.per_channel,
               "frames_per_message": args.frames_per_message,
               "protocol": args.protocol, "http": f"http://127.0.0.1:{http_port}"}
        p = ctx.Process(target=client_proc, args=(job, out))
        p.start()
        procs.append(p)
    time.sleep(max(0.0, start_at - time.time()))
    srv.stdin.write("mark\n")
    srv.stdin.flush()
    results: list[dict] = []
    client_cpu = 0.0
    for _ in procs:
        got = out.get()
        results += got["calls"]
        client_cpu += got["cpu_s"]
    srv.stdin.write("report\n")
    srv.stdin.flush()
    server = json.loads(srv.stdout.readline())
    for p in procs:
        p.join()
    return results, client_cpu, server


def _summary(args: argparse.Namespace, streams: int, results: list[dict], client_cpu: float,
             server: dict) -> dict:
    ok = [r for r in results if r["status"] == "OK"]
    rej = [r for r in results if r["status"] == "RESOURCE_EXHAUSTED"]
    other = sorted({r["status"] for r in results} - {"OK", "RESOURCE_EXHAUSTED"})
    late = [r["max_late_ms"] for r in ok if r.get("frames")]
    summary = {
        "mode": args.mode, "streams" if args.mode == "closed" else "rate": (
            streams if args.mode == "closed" else args.rate),
        "protocol": args.protocol,
        "pace_lead_s": server["pace_lead_s"], "frames_per_message": args.frames_per_message,
        "front_procs": args.front_procs,
        "calls": len(results), "ok": len(ok), "rejected": len(rej), "other": other,
        "frames_per_s": round(server["frames_per_s"]),
        "client_cpu_share": round(client_cpu / server["window_s"], 3),
        "front_cpu_share": round(server["front_cpu_share"], 3),
        "cpu_us_per_frame": round(server["cpu_us_per_frame"], 1),
        "loop_lag_ms_p50": round(server["loop_lag_ms_p50"], 2),
        "loop_lag_ms_p99": round(server["loop_lag_ms_p99"], 2),
        "loop_lag_ms_max": round(server["loop_lag_ms_max"], 2),
        "ttfa_ms_p50": pct([r["ttfa_ms"] for r in ok if "ttfa_ms" in r], 0.5),
        "ttfa_ms_p95": pct([r["ttfa_ms"] for r in ok if "ttfa_ms" in r], 0.95),
        "max_late_ms_p50": pct(late, 0.5), "max_late_ms_p95": pct(late, 0.95),
        "max_late_ms_max": pct(late, 1.0),
        "streams_with_underrun": sum(x > 0 for x in late),
        "streams_late_over_20ms": sum(x > 20 for x in late),
        "underrun_frames": sum(r.get("late_frames", 0) for r in ok),
        "frames_received": sum(r.get("frames", 0) for r in ok),
        "reject_ms_p50": pct([r["reject_ms"] for r in rej], 0.5),
        "reject_ms_p95": pct([r["reject_ms"] for r in rej], 0.95),
        "reject_ms_max": pct([r["reject_ms"] for r in rej], 1.0),
        "server": server,
    }
    if rej:
        summary["reject_message"] = rej[0].get("details")
    return summary


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        p = argparse.ArgumentParser()
        for a in ("--port", "--max-sessions", "--frames"):
            p.add_argument(a, type=int)
        for a in ("--margin", "--base-ms", "--per-row-ms"):
            p.add_argument(a, type=float)
        p.add_argument("--cpus", default="")
        p.add_argument("--profile", default="")
        p.add_argument("--loop", default="uvloop")
        p.add_argument("--admit-packets", default="1,4")
        p.add_argument("--pace-lead", type=float, default=None)
        p.add_argument("--front-procs", type=int, default=0)
        p.add_argument("--http-port", type=int, default=0)
        p.add_argument("--stall-stacks", action="store_true")
        serve(p.parse_args(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(prog="python -m bench.front_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("closed", "open"), default="closed")
    p.add_argument("--protocol", choices=("grpc", "ws"), default="grpc",
                   help="gRPC Synthesize, or the WebSocket (1 frame a message; the gRPC "
                        "front processes do not serve it)")
    p.add_argument("--streams", default="64,128,256", help="closed: concurrent streams, "
                   "comma-separated levels")
    p.add_argument("--frames", type=int, default=100, help="codec frames (80 ms) per "
                   "utterance (100 = 8 s)")
    p.add_argument("--period-ms", type=float, default=24.0, help="closed: the stand-in's "
                   "step period, whatever the batch (24: the 0.6B on an H100 at 256)")
    p.add_argument("--rate", type=float, default=50.0, help="open: arrivals per second")
    p.add_argument("--seconds", type=float, default=20.0, help="open: arrival window")
    p.add_argument("--base-ms", type=float, default=4.0, help="open: stand-in step period "
                   "at batch 0")
    p.add_argument("--per-row-ms", type=float, default=0.32, help="open: stand-in step "
                   "period per stream in the batch (0.32: 20 ms at 50 streams)")
    p.add_argument("--margin", type=float, default=None, help="TTS_ADMIT_MARGIN (0: off; "
                   "default 0 closed: all start at once, the front is measured; 0.7 open)")
    p.add_argument("--max-sessions", type=int, default=0, help="TTS_MAX_SESSIONS (0: "
                   "streams + 16 closed, 4096 open)")
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--front-procs", type=int, default=0,
                   help="TTS_FRONT_PROCS: gRPC front processes (their CPU is not the "
                        "front's here: `front_cpu` is the engine's process, the rest)")
    p.add_argument("--frames-per-message", type=int, default=1,
                   help="SessionConfig.frames_per_message (1, the contract's default: a "
                        "message per 20 ms frame)")
    p.add_argument("--per-channel", type=int, default=16, help="streams per gRPC channel "
                   "(HTTP/2 connection) in a client process")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--admit-packets", default="1,4", help="packet sizes (first,later) the "
                   "server's settings state, for admission's start-up rule; the stand-in "
                   "always sends 1,4 like the engine (1,1: admission allows 56 ms steps)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the server's event loop (the server's default: uvloop)")
    p.add_argument("--pace-lead", type=float, default=None, help="TTS_PACE_LEAD_S: frames "
                   "go out in real time this far ahead (0: as fast as made; default: the "
                   "server's)")
    p.add_argument("--profile", default="", help="cProfile the server's event loop thread "
                   "over the measured window into this file")
    p.add_argument("--stall-stacks", action="store_true", help="sample the server loop's "
                   "stack while it stalls (> 20 ms late) and time GC pauses "
                   "(bench/loop_stalls.py); in each level's JSON as `stalls`")
    p.add_argument("--out", default="", help="also append each level's JSON here")
    args = p.parse_args()
    if args.margin is None:
        args.margin = 0.0 if args.mode == "closed" else 0.7
    levels = [int(x) for x in args.streams.split(",")] if args.mode == "closed" else [0]
    for streams in levels:
        port = args.port or _free_port()
        r = run_level(args, streams, port)
        line = json.dumps(r)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
