"""The soak: starts (or finds) the server, plans the arrivals, runs the load, samples."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import queue as queue_mod
import signal
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from bench.soak.client import Load, _child
from bench.soak.plan import Plan, make_plans
from bench.soak.report import _r, pct, summarize
from bench.soak.server import Server, nvidia_smi_mb


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
        opts = {"addr": self.server.addr, "protocol": a.protocol,
                "http_port": self.server.http_port,
                "channels": a.channels, "frame_ms": a.frame_ms,
                "frames_per_message": a.frames_per_message,
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
        return summarize(self, load, model, planned, recs, active, final, alive, health,
                         metrics_end, faults)


def _mb(b: float | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)

