"""A reply's first frame on the agent's socket speaker: captured -> sent (CPU, no models).

The socket doors' speaker (`voice_agent.conversation.speaker.SocketSpeaker`) sends a
reply's frames on 20 ms ticks. On a free-running grid (`on_demand` off, as a device keeps
time) a reply's first frame waits for the grid's next slot: 0-20 ms, 10 on average, on
every turn's end of turn -> first audio. `on_demand` (the socket speaker's) starts the
reply's ticks with its first frame. This hands the speaker replies at random phases, as
the TTS would, and measures both.

    .venv/agent/bin/python -m bench.speaker_first_frame --replies 50
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import numpy as np
from livekit import rtc
from voice_agent.conversation.speaker import SocketSpeaker

RATE, FRAME_MS = 24000, 20
FS = RATE * FRAME_MS // 1000


def _frame() -> rtc.AudioFrame:
    return rtc.AudioFrame(data=np.ones(FS, np.int16).tobytes(), sample_rate=RATE,
                          num_channels=1, samples_per_channel=FS)


async def measure(on_demand: bool, replies: int, seed: int = 1) -> list[float]:
    """ms from a reply's first frame captured to it being sent, one per reply."""
    sent: list[tuple[float, bool]] = []
    out = SocketSpeaker(lambda pcm, first: sent.append((time.perf_counter(), first)),
                        lambda: None, sample_rate=RATE, frame_ms=FRAME_MS)
    out.on_demand = on_demand
    out.start()
    rng = random.Random(seed)
    took = []
    try:
        for _ in range(replies):
            await asyncio.sleep(rng.uniform(0.05, 0.09))  # a pause, at any phase
            t = time.perf_counter()
            for _ in range(2):
                await out.capture_frame(_frame())
            out.flush()
            while out.playing:
                await asyncio.sleep(0.005)
            took.append((next(at for at, first in reversed(sent) if first) - t) * 1e3)
    finally:
        await out.aclose()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.speaker_first_frame",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replies", type=int, default=50, help="replies per mode (default 50)")
    args = ap.parse_args()
    print("| speaker | replies | captured -> sent p50 / mean / p95 / max ms |")
    print("|---|---|---|")
    for on_demand in (False, True):
        took = sorted(asyncio.run(measure(on_demand, args.replies)))
        p95 = took[min(len(took) - 1, int(0.95 * len(took)))]
        name = "on_demand (the socket's)" if on_demand else "free-running 20 ms grid"
        print(f"| {name} | {len(took)} | {statistics.median(took):.1f} / "
              f"{statistics.mean(took):.1f} / {p95:.1f} / {took[-1]:.1f} |")


if __name__ == "__main__":
    main()
