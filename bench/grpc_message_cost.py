"""What one streamed gRPC message costs a grpc.aio server process, with nothing of ours in
the way: the floor under the TTS front's per-frame cost (issue "The TTS at the GPU's own
bound": at 1 frame a message the front, not the GPU, sets the capacity).

A server process pinned to CPU 0 (uvloop, as `python -m voice_tts.server` runs) streams
`--messages` messages on each of `--streams` concurrent `stream_stream` calls, as fast as
the clients read; the clients run in one process on the other CPUs. Modes:
- raw:   a pre-serialized SynthesizeResponse (a 20 ms frame of 24 kHz s16) yielded as bytes;
- proto: the same message built as protobuf objects per message and serialized (what
  fronts/service.py does).
Reported: the server's CPU per message (user + system, all its threads) and messages/s.
Compare with `bench.front_bench`'s `cpu_us_per_frame` (the whole front) on the same host.

  python -m bench.grpc_message_cost
  python -m bench.grpc_message_cost --streams 128 --messages 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import time
from typing import Any

FRAME_BYTES = 960  # 20 ms of 24 kHz s16le


def _server(port: int, mode: str, messages: int, q: Any) -> None:
    os.sched_setaffinity(0, {0})
    import grpc
    import uvloop
    from voice.tts.v1 import tts_pb2

    pcm = bytes(FRAME_BYTES)
    raw = tts_pb2.SynthesizeResponse(audio=tts_pb2.AudioFrame(
        seq=1, pcm=pcm, start_ms=20, text_chars=12)).SerializeToString()

    async def handler(requests: Any, _ctx: Any) -> Any:
        async for _ in requests:
            break
        for i in range(messages):
            if mode == "raw":
                yield raw
            else:
                yield tts_pb2.SynthesizeResponse(audio=tts_pb2.AudioFrame(
                    seq=i, pcm=pcm, start_ms=i * 20, text_chars=12)).SerializeToString()

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "bench.Cost", {"Stream": grpc.stream_stream_rpc_method_handler(handler)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        q.put("ready")
        await server.wait_for_termination()

    uvloop.run(main())


async def _clients(port: int, streams: int) -> tuple[int, float]:
    import grpc

    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}")
                for _ in range(max(1, streams // 16))]

    async def one(i: int) -> int:
        call = channels[i % len(channels)].stream_stream("/bench.Cost/Stream")()
        await call.write(b"go")
        await call.done_writing()
        n = 0
        while await call.read() is not grpc.aio.EOF:
            n += 1
        return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - t0
    for ch in channels:
        await ch.close()
    return sum(counts), wall


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, streams: int, messages: int) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_server, args=(port, mode, messages, q), daemon=True)
    proc.start()
    try:
        if q.get(timeout=60) != "ready":
            raise RuntimeError("server did not start")
        cpu0 = _cpu_s(proc.pid)
        n, wall = asyncio.run(_clients(port, streams))
        cpu = _cpu_s(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.join(10)
    return {"mode": mode, "streams": streams, "messages": n, "wall_s": round(wall, 2),
            "server_cpu_us_per_message": round(cpu / max(1, n) * 1e6, 1),
            "messages_per_s": round(n / wall)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--messages", type=int, default=500, help="per stream")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))  # CPU 0: the server's
    rows = [measure(mode, a.streams, a.messages) for mode in ("raw", "proto")]
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
