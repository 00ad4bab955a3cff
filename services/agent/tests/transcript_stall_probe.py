"""The event loop's longest stall during a process's first reply through the transcript
synchronizer (run as a script, so the framework's lazy state is fresh):

    python transcript_stall_probe.py [--warm]   ->  {"max_cpu_ms": ..., "max_wall_ms": ...}

The reply is what `DirectSession` wires: livekit-agents' `TranscriptSynchronizer` over
our real-time `SpeakerOutput`, fed a reply's text and 1.2 s of audio. A monitor task
ticks every millisecond; a stall is the gap between two ticks. `max_cpu_ms` counts the
loop thread's own CPU in the worst gap (work that blocked the loop), which a busy host's
preemption does not inflate; `max_wall_ms` is the gap itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import numpy as np
from livekit import rtc
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer
from voice_agent.audio_io import SpeakerOutput
from voice_agent.warmup import warm_transcript_timing

REPLY = ("Hello there! Of course, I can help with that. The weather tomorrow looks "
         "wonderful, with sunshine in the afternoon.")


async def monitor(stop: asyncio.Event, worst: dict[str, float]) -> None:
    wall, cpu = time.perf_counter(), time.thread_time()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        w, c = time.perf_counter(), time.thread_time()
        worst["max_wall_ms"] = max(worst["max_wall_ms"], (w - wall) * 1e3)
        worst["max_cpu_ms"] = max(worst["max_cpu_ms"], (c - cpu) * 1e3)
        wall, cpu = w, c


async def main(warm: bool) -> None:
    if warm:
        warm_transcript_timing()
    speaker = SpeakerOutput(sample_rate=24000, frame_ms=20)
    speaker.start()
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=None)
    rng = np.random.default_rng(0)
    frames = [rtc.AudioFrame((rng.standard_normal(480) * 3000).astype(np.int16).tobytes(),
                             24000, 1, 480) for _ in range(60)]  # 1.2 s of "speech"
    worst = {"max_cpu_ms": 0.0, "max_wall_ms": 0.0}
    stop = asyncio.Event()
    mon = asyncio.create_task(monitor(stop, worst))
    await asyncio.sleep(0.2)  # the loop settled and the monitor ticking
    worst.update(max_cpu_ms=0.0, max_wall_ms=0.0)
    for word in REPLY.split(" "):  # as the LLM streams it
        await sync.text_output.capture_text(word + " ")
        await asyncio.sleep(0)
    sync.text_output.flush()
    for frame in frames:
        await sync.audio_output.capture_frame(frame)
        await asyncio.sleep(0)  # frames come from the TTS one by one
    sync.audio_output.flush()
    await asyncio.wait_for(sync.audio_output.wait_for_playout(), 10)
    stop.set()
    await mon
    await sync.aclose()
    await speaker.aclose()
    print(json.dumps(worst))


if __name__ == "__main__":
    asyncio.run(main("--warm" in sys.argv))
