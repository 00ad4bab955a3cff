"""Client-side TTFA/RTF through a real `voice_tts.server` (gRPC on localhost), c streams at
once, to set against the engine's in-process figures (bench/run.py): the service's cost.
Run the server with TTS_PACE_LEAD_S=0: a paced server delivers in real time after its
first second, so the client-side RTF would measure the pacing, not the synthesis.

  python -m bench.grpc_bench --addr 127.0.0.1:50051 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import grpc
from voice.tts.v1 import tts_pb2
from voice_tts.client import synthesize

from bench.run import TEXT


async def level(addr: str, c: int, frames: int) -> dict:
    async with grpc.aio.insecure_channel(addr) as ch:
        async def one(i: int):
            cfg = tts_pb2.SessionConfig(voice="vivian", seed=i)
            cfg.sampling.max_frames = frames
            return await synthesize(ch, [TEXT], cfg)

        await asyncio.gather(*(one(i) for i in range(c)))  # warm-up
        res = await asyncio.gather(*(one(i) for i in range(c)))
    ttfa = sorted(r.ttfa_s * 1e3 for r in res if r.ttfa_s is not None)
    server = sorted(r.server_ttfa_ms or 0.0 for r in res)
    return {"concurrency": c, "client_ttfa_ms_p50": statistics.median(ttfa),
            "client_ttfa_ms_max": ttfa[-1], "server_ttfa_ms_p50": statistics.median(server),
            "service_overhead_ms_p50": statistics.median(ttfa) - statistics.median(server),
            "rtf_p50": statistics.median(r.rtf for r in res)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--frames", type=int, default=60)
    args = p.parse_args()
    for c in (int(x) for x in args.concurrency.split(",")):
        r = asyncio.run(level(args.addr, c, args.frames))
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}),
              flush=True)


if __name__ == "__main__":
    main()
