"""The bridge's starter before and after (2026-12-07): the time from a reply's first LLM
piece to its first audio, through the agent's TTS plugin and a real TTS server, with the
segmenter of commit 850b7c3 (the starter waited for a word's end and 6 characters) and
the tree's (the first 6 characters go out piece by piece). The pieces are cut as a BPE
tokenizer cuts English (a word with its leading space; punctuation apart) and come every
`--gap-ms`, an LLM's decode step. Configs alternate, reply by reply.

    # a TTS server: TTS_MODEL=preset:tiny .venv/tts/bin/python -m voice_tts.server (CPU), or
    # the 0.6B on a GPU; then
    .venv/agent/bin/python bench/results/2026-12-07-starter/starter_ab.py --tts 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from livekit.agents import APIConnectOptions
from voice_agent import bridge
from voice_agent.plugins import TTS
from voice_agent.plugins import tts as tts_mod

REPO = Path(__file__).resolve().parents[3]
BEFORE = "850b7c3"
REPLIES = ["Sure, I can help with that.", "I think the train leaves at nine.",
           "Yes! The museum opens at ten tomorrow.", "Hello there, how are you today?",
           "Of course. Let me check that for you.", "The weather will be sunny and warm.",
           "Your table for two is booked at seven.", "Okay, calling your sister now."]
ONCE = APIConnectOptions(max_retry=0, timeout=30)


def old_segmenter() -> Callable[..., object]:
    src = subprocess.run(["git", "show", f"{BEFORE}:services/agent/src/voice_agent/bridge.py"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("old_bridge")
    sys.modules["old_bridge"] = mod  # its dataclasses look their module up
    exec(compile(src, "old_bridge.py", "exec"), mod.__dict__)
    return lambda config, flushes=False: mod.TextSegmenter(config)  # it knew no flushes


def pieces(text: str) -> list[str]:
    return re.findall(r" ?[A-Za-z']+|[^A-Za-z' ]", text)


async def first_audio_ms(tts: TTS, text: str, gap_s: float) -> float:
    stream = tts.stream(conn_options=ONCE)
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in stream:
            got.set()

    task = asyncio.create_task(consume())
    t0 = time.perf_counter()
    for p in pieces(text):
        stream.push_text(p)
        if got.is_set():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.wait(), gap_s)
    else:
        stream.end_input()  # no audio yet: the reply's end flushes it
    await asyncio.wait_for(got.wait(), 30)
    ms = (time.perf_counter() - t0) * 1000
    await stream.aclose()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return ms


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tts", required=True, help="the TTS server's gRPC address")
    ap.add_argument("--voice", default="aiden")
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    configs: dict[str, Callable[..., object]] = {f"before ({BEFORE})": old_segmenter(),
                                                 "after": bridge.TextSegmenter}
    tts = TTS(addr=args.tts, voice=args.voice, max_frames=8)
    got: dict[str, list[float]] = {k: [] for k in configs}
    await first_audio_ms(tts, REPLIES[0], args.gap_ms / 1000)  # warm
    for _ in range(args.rounds):
        for text in REPLIES:
            for name, cls in configs.items():
                tts_mod.TextSegmenter = cls  # type: ignore[misc]
                got[name].append(await first_audio_ms(tts, text, args.gap_ms / 1000))
    await tts.aclose()
    print(f"first LLM piece -> first audio, {len(REPLIES)} replies x {args.rounds}, a piece "
          f"every {args.gap_ms:.0f} ms, TTS at {args.tts}:")
    for name, xs in got.items():
        xs.sort()
        print(f"  {name:20s} p50 {statistics.median(xs):6.1f} ms  p95 "
              f"{xs[int(0.95 * (len(xs) - 1))]:6.1f} ms  mean {statistics.mean(xs):6.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
