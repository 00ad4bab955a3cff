"""user_bot: joins the case's room, waits for the double ACK, speaks the case's WAV.

It publishes a microphone track (16 kHz mono AudioSource) and pushes the clip in
10 ms frames; `AudioSource.capture_frame` paces them in real time (its queue is
small), so the EoT moment is when the frame holding the last speech sample was
captured plus the source's queue, measured with `wait_for_playout()`. It waits for
`probe_ready` (from the probe) and `agent_ready` (from the agent) before speaking
(seed D10); the data messages it sends (voice_agent.marks, the agent's contract) let the
agent tag its turn with our trace id.

Also: `mint_token` (a LiveKit JWT from the API key/secret, livekit-api).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import numpy as np
from voice_agent.marks import (
    AGENT_READY,
    CASE_START,
    EOT,
    PROBE_READY,
    TOPIC_AGENT,
    TOPIC_PROBE,
    TOPIC_USER,
    decode,
    encode,
)

from .speech import USER_RATE, UserClip

FRAME_MS = 10


def mint_token(api_key: str, api_secret: str, *, room: str, identity: str,
               ttl_s: int = 600) -> str:
    from livekit import api

    grants = api.VideoGrants(room_join=True, room=room, can_publish=True,
                             can_subscribe=True, can_publish_data=True)
    return (api.AccessToken(api_key, api_secret).with_identity(identity).with_name(identity)
            .with_grants(grants).with_ttl(timedelta(seconds=ttl_s)).to_jwt())


class UserBot:
    """The LiveKit side of the user (needs a LiveKit server; not run in CI)."""

    def __init__(self, trace_id: str, case_id: str) -> None:
        self.trace_id, self.case_id = trace_id, case_id
        self.probe_ready = asyncio.Event()
        self.agent_ready = asyncio.Event()
        self.room: Any = None
        self.source: Any = None

    async def connect(self, url: str, token: str) -> None:
        from livekit import rtc

        self.room = rtc.Room()

        @self.room.on("data_received")
        def _on_data(packet: Any) -> None:
            msg = decode(packet.data)
            if msg is None or msg.get("trace_id") != self.trace_id:
                return
            if packet.topic == TOPIC_PROBE and msg.get("type") == PROBE_READY:
                self.probe_ready.set()
            elif packet.topic == TOPIC_AGENT and msg.get("type") == AGENT_READY:
                self.agent_ready.set()

        await self.room.connect(url, token)
        self.source = rtc.AudioSource(USER_RATE, 1, queue_size_ms=100)
        track = rtc.LocalAudioTrack.create_audio_track("user-mic", self.source)
        opts = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        await self.room.local_participant.publish_track(track, opts)
        await self.send(CASE_START)

    async def send(self, kind: str, **extra: object) -> None:
        await self.room.local_participant.publish_data(
            encode(kind, self.trace_id, self.case_id, **extra), topic=TOPIC_USER)

    async def wait_ready(self, timeout_s: float) -> list[str]:
        """Wait for the double ACK; returns what is missing (empty = both arrived)."""
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(self.probe_ready.wait(), self.agent_ready.wait())
        except TimeoutError:
            pass
        return [n for n, e in (("probe_ready", self.probe_ready),
                               ("agent_ready", self.agent_ready)) if not e.is_set()]

    async def speak(self, clip: UserClip) -> tuple[float, float]:
        """Push the clip in real time; returns (start, eot) perf times."""
        from livekit import rtc

        pcm = clip.pcm16()
        n = USER_RATE * FRAME_MS // 1000
        eot_frame = int(clip.end_of_speech_s * USER_RATE) // n
        start = time.perf_counter()
        eot = start + clip.end_of_speech_s
        for k, i in enumerate(range(0, len(pcm), n)):
            chunk = pcm[i : i + n]
            if len(chunk) < n:
                chunk = np.concatenate([chunk, np.zeros(n - len(chunk), np.int16)])
            await self.source.capture_frame(rtc.AudioFrame(
                data=chunk.tobytes(), sample_rate=USER_RATE, num_channels=1,
                samples_per_channel=n))
            if k == eot_frame:
                # The frame with the last speech sample is queued: it plays once the queue
                # ahead of it has drained.
                await self.source.wait_for_playout()
                eot = time.perf_counter()
                await self.send(EOT)
        return start, eot

    async def aclose(self) -> None:
        if self.room is not None:
            await self.room.disconnect()
