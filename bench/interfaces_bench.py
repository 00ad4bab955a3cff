"""Time to first audio byte through each of the service's three interfaces, in one run
against one running server: gRPC `Synthesize`, OpenAI's `POST /v1/audio/speech` (pcm,
streamed) and the WebSocket `/v1/audio/speech/stream`. All three are adapters over one
synthesis call, so what differs is the front's cost (framing, event loop, transport).

Method, per concurrency c: a warm-up round of each protocol (not counted; it also opens
the HTTP keep-alive connections), then `--rounds` rounds of each, the protocols in turn
(grpc, http, ws; the order rotated every round) so drift hits all alike. A round is c
calls of one protocol at once, all with TEXT (bench/run.py), voice vivian, seed i (the
call's index), `max_frames` = `--frames`. Measured on the client:

- t0, gRPC: just before the text is written (the config went first, on the open channel);
  HTTP: just before the POST is sent (config and text in its body; a kept-alive
  connection); WS: just before the text message is sent, the socket open and the config
  sent. `ws+connect` is the same WS calls timed from before the connect (handshake and
  config included): a client that opens a socket per utterance pays that.
- TTFB: t0 -> the first audio byte (gRPC: first AudioFrame; HTTP: first body bytes;
  WS: first binary frame). RTF: t0 -> the last audio byte, over the audio's length.
- server TTFA: the engine's own (gRPC: FIRST_AUDIO's timings.ttfa_ms; WS: the
  `first_audio` event's timings.ttfa_ms; HTTP: the `X-TTS-Ttfa-Ms` header); `front`:
  TTFB less server TTFA, per call (the front and transport alone).

Prints one JSON line per (protocol, c) with p50/p90/max TTFB, server TTFA and front p50s
and each p50's delta to gRPC's at the same c, then a table; `--out` writes rows and every call.
Exits 1 if any call failed. Run the server with TTS_PACE_LEAD_S=0 (a paced stream's RTF
measures the pacing) and an HTTP port:

  python -m bench.interfaces_bench --grpc-addr 127.0.0.1:50051 --http http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp
import grpc
from voice.tts.v1 import tts_pb2
from voice_tts.client import synthesize

from bench.run import TEXT, pct

PROTOCOLS = ("grpc", "http", "ws")
VOICE = "vivian"
SAMPLE_RATE = 24000


@dataclass
class Call:
    protocol: str
    concurrency: int
    seed: int
    warmup: bool = False
    ttfb_ms: float | None = None
    connect_ttfb_ms: float | None = None  # WS only: from before the connect
    last_ms: float | None = None
    audio_s: float = 0.0
    server_ttfa_ms: float | None = None
    error: str | None = None

    @property
    def rtf(self) -> float | None:
        return self.last_ms / 1e3 / self.audio_s if self.last_ms and self.audio_s else None


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


async def grpc_call(ch: grpc.aio.Channel, call: Call, frames: int) -> None:
    cfg = tts_pb2.SessionConfig(voice=VOICE, seed=call.seed, sample_rate=SAMPLE_RATE)
    cfg.sampling.max_frames = frames
    try:
        res = await synthesize(ch, [TEXT], cfg)
    except grpc.aio.AioRpcError as e:
        call.error = f"gRPC {e.code().name}: {e.details()}"
        return
    if res.ttfa_s is not None:
        call.ttfb_ms = res.ttfa_s * 1e3
        call.last_ms = res.frame_times[-1] * 1e3
    call.audio_s, call.server_ttfa_ms = res.audio_s, res.server_ttfa_ms


async def http_call(http: aiohttp.ClientSession, base: str, call: Call, frames: int) -> None:
    body = {"input": TEXT, "voice": VOICE, "response_format": "pcm", "seed": call.seed,
            "sampling": {"max_frames": frames}}
    size = 0
    t0 = time.perf_counter()
    async with http.post(f"{base}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            call.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
            return
        if "X-TTS-Ttfa-Ms" in resp.headers:
            call.server_ttfa_ms = float(resp.headers["X-TTS-Ttfa-Ms"])
        async for chunk in resp.content.iter_any():
            if chunk and call.ttfb_ms is None:
                call.ttfb_ms = ms_since(t0)
            size += len(chunk)
        call.last_ms = ms_since(t0)
    call.audio_s = size / 2 / SAMPLE_RATE


async def ws_call(http: aiohttp.ClientSession, base: str, call: Call, frames: int) -> None:
    url = base.replace("http", "ws", 1) + "/v1/audio/speech/stream"
    config = {"type": "config", "voice": VOICE, "seed": call.seed,
              "sample_rate": SAMPLE_RATE, "sampling": {"max_frames": frames}}
    size = 0
    t_connect = time.perf_counter()
    async with http.ws_connect(url) as ws:
        await ws.send_json(config)
        t0 = time.perf_counter()
        await ws.send_json({"type": "text", "text": TEXT})
        await ws.send_json({"type": "end"})
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                if call.ttfb_ms is None:
                    call.ttfb_ms = ms_since(t0)
                    call.connect_ttfb_ms = ms_since(t_connect)
                size += len(msg.data)
                call.last_ms = ms_since(t0)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                if event["type"] == "first_audio":
                    call.server_ttfa_ms = event["timings"]["ttfa_ms"]
                elif event["type"] == "error":
                    call.error = f"WS error event {event['code']}: {event['message']}"
        if ws.close_code != aiohttp.WSCloseCode.OK and call.error is None:
            call.error = f"WS closed with {ws.close_code} ({ws.exception()})"
    call.audio_s = size / 2 / SAMPLE_RATE


async def one(protocol: str, call: Call, ch: grpc.aio.Channel, http: aiohttp.ClientSession,
              base: str, frames: int, timeout_s: float) -> Call:
    run = {"grpc": lambda: grpc_call(ch, call, frames),
           "http": lambda: http_call(http, base, call, frames),
           "ws": lambda: ws_call(http, base, call, frames)}[protocol]
    try:
        await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        call.error = f"no end within {timeout_s} s"
    except (aiohttp.ClientError, OSError) as e:
        call.error = f"{type(e).__name__}: {e}"
    if call.error is None and call.ttfb_ms is None:
        call.error = "no audio"
    return call


async def round_of(protocol: str, c: int, ch: grpc.aio.Channel, http: aiohttp.ClientSession,
                   args: argparse.Namespace, warmup: bool = False) -> list[Call]:
    return await asyncio.gather(*(
        one(protocol, Call(protocol, c, seed=i, warmup=warmup), ch, http, args.http,
            args.frames, args.timeout) for i in range(c)))


async def level(c: int, args: argparse.Namespace) -> list[Call]:
    calls: list[Call] = []
    # limit=0: no cap on open connections, so c HTTP calls really run at once.
    async with grpc.aio.insecure_channel(args.grpc_addr) as ch, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0)) as http:
        for p in PROTOCOLS:
            calls += await round_of(p, c, ch, http, args, warmup=True)
        for r in range(args.rounds):
            for k in range(len(PROTOCOLS)):
                calls += await round_of(PROTOCOLS[(r + k) % len(PROTOCOLS)], c, ch, http, args)
    return calls


def summarize(calls: list[Call], c: int) -> list[dict]:
    def p50(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    ok = [x for x in calls if x.concurrency == c and not x.warmup and x.error is None]
    rows = []
    for name in (*PROTOCOLS, "ws+connect"):
        # ws+connect: the ws calls, timed from before the connect.
        timed = [(x.connect_ttfb_ms if name == "ws+connect" else x.ttfb_ms, x)
                 for x in ok if x.protocol == name.split("+")[0]]
        timed = [(t, x) for t, x in timed if t is not None]
        if not timed:
            continue
        ttfb = sorted(t for t, _ in timed)
        server = [x.server_ttfa_ms for _, x in timed if x.server_ttfa_ms is not None]
        # Per call, client TTFB less the engine's TTFA: the front's own cost, steadier
        # than either (the engine's share varies call to call, alike for all fronts).
        front = [t - x.server_ttfa_ms for t, x in timed if x.server_ttfa_ms is not None]
        rows.append({"protocol": name, "concurrency": c, "calls": len(ttfb),
                     "ttfb_ms_p50": p50(ttfb), "ttfb_ms_p90": pct(ttfb, 0.9),
                     "ttfb_ms_max": ttfb[-1], "server_ttfa_ms_p50": p50(server),
                     "front_ms_p50": p50(front),
                     "rtf_p50": p50([r for _, x in timed if (r := x.rtf) is not None])})
    base = next((r for r in rows if r["protocol"] == "grpc"), None)
    for r in rows:
        for key in ("ttfb_ms_p50", "server_ttfa_ms_p50", "front_ms_p50"):
            have = base is not None and r[key] is not None and base[key] is not None
            r[key.replace("_p50", "_p50_vs_grpc")] = r[key] - base[key] if have else None
    return rows


def rounded(row: dict) -> dict:
    return {k: round(v, 3 if k == "rtf_p50" else 2) if isinstance(v, float) else v
            for k, v in row.items()}


def table(rows: list[dict]) -> str:
    def f(v: float | None, spec: str = ".1f", sign: str = "") -> str:
        return "-" if v is None else format(v, sign + spec)

    lines = ["| protocol | c | calls | TTFB p50 | p90 | max | vs gRPC p50 | server TTFA p50 "
             "| vs gRPC | TTFB - server p50 | vs gRPC | RTF p50 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['protocol']} | {r['concurrency']} | {r['calls']} | {f(r['ttfb_ms_p50'])} "
            f"| {f(r['ttfb_ms_p90'])} | {f(r['ttfb_ms_max'])} "
            f"| {f(r['ttfb_ms_p50_vs_grpc'], sign='+')} | {f(r['server_ttfa_ms_p50'])} "
            f"| {f(r['server_ttfa_ms_p50_vs_grpc'], sign='+')} | {f(r['front_ms_p50'])} "
            f"| {f(r['front_ms_p50_vs_grpc'], sign='+')} | {f(r['rtf_p50'], '.3f')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grpc-addr", default="127.0.0.1:50051")
    p.add_argument("--http", default="http://127.0.0.1:8001",
                   help="base URL of the HTTP port (WS: the same, ws://)")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--rounds", type=int, default=5, help="counted rounds per protocol")
    p.add_argument("--frames", type=int, default=60, help="codec frames (80 ms) per call")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    p.add_argument("--out", help="JSON file: the rows and every call")
    args = p.parse_args()
    args.http = args.http.rstrip("/")

    rows: list[dict] = []
    calls: list[Call] = []
    for c in (int(x) for x in args.concurrency.split(",")):
        mine = asyncio.run(level(c, args))
        calls += mine
        for row in summarize(mine, c):
            rows.append(row)
            print(json.dumps(rounded(row)), flush=True)
    print(table(rows))
    failed = [x for x in calls if x.error]
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "rows": [rounded(r) for r in rows],
                       "calls": [asdict(x) for x in calls]}, fh, indent=1)
    if failed:
        for x in failed[:20]:
            print(f"FAILED {x.protocol} c={x.concurrency} seed={x.seed}: {x.error}",
                  file=sys.stderr)
        print(f"{len(failed)} of {len(calls)} calls (warm-up included) failed",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
