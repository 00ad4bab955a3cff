"""Direct mode: the real AgentSession on our own microphone/speaker, no LiveKit.

The conversation every door runs (conversation/core.py: plugins, Silero VAD, duplex
controller, fallback, transcript synchronizer), with `MicrophoneInput` / `SpeakerOutput`
in place of the room's tracks. Used by `python -m voice_agent --direct`, the AutoRTC
suite, the local mesh, and the agent's own tests.

    async with DirectSession(settings) as ds:      # greets (unless greet=False)
        await ds.wait_until_quiet()
        await ds.say_user(pcm16k)                   # real-time "speech"
        await ds.wait_until_quiet()
    ds.result().write_wav("reply.wav")

`run_direct_session(settings, user_wav=..., out_wav=...)` does exactly that for one
file (several files = several user turns, each after the agent has answered).
"""

from __future__ import annotations

import asyncio
import logging
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from livekit import rtc

from .agent import starter_phrases
from .audio_io import MicrophoneInput, SpeakerOutput
from .conversation.core import Conversation
from .duplex import BargeIn, DuplexState
from .metrics import TurnTracker
from .settings import AgentSettings
from .voices import check_configured_voice
from .warmup import warm_transcript_timing

log = logging.getLogger("voice_agent.direct")

MIC_RATE = 16000


def read_wav_16k(path: str | Path) -> np.ndarray:
    """A WAV file as int16 mono at 16 kHz (mixed down and resampled as needed)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit PCM WAV, got {8 * w.getsampwidth()}-bit")
        ch, rate = w.getnchannels(), w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    if ch > 1:
        data = data.reshape(-1, ch).mean(axis=1).astype(np.int16)
    if rate != MIC_RATE:
        rs = rtc.AudioResampler(input_rate=rate, output_rate=MIC_RATE, num_channels=1)
        frame = rtc.AudioFrame(data=data.tobytes(), sample_rate=rate, num_channels=1,
                               samples_per_channel=len(data))
        out = [*rs.push(frame), *rs.flush()]
        data = np.frombuffer(b"".join(bytes(f.data) for f in out), dtype=np.int16)
    return data


@dataclass
class DirectResult:
    recording: bytes  # the agent's side, int16 mono, on the microphone's timeline
    sample_rate: int
    turns: list[dict[str, object]]  # per-turn metrics (metrics.Turn.report())
    barge_ins: list[BargeIn]
    transitions: list[tuple[float, DuplexState]]
    chat: list[dict[str, object]]  # the chat context: role, text, interrupted
    fallback_events: list[str] = field(default_factory=list)

    def write_wav(self, path: str | Path) -> None:
        """The agent's side (16-bit mono at the TTS rate) as a WAV file."""
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(self.sample_rate)
            w.writeframes(self.recording)


class DirectSession(Conversation):
    """A conversation (conversation/core.py) on a local mic and speaker, and the ways a
    test drives and reads it."""

    mic: MicrophoneInput
    speaker: SpeakerOutput

    def __init__(self, settings: AgentSettings, *, greet: bool = True) -> None:
        if not greet:
            settings = settings.model_copy(update={"greeting": ""})
        tracker = TurnTracker()
        speaker = SpeakerOutput(sample_rate=settings.tts_sample_rate,
                                frame_ms=settings.tts_frame_ms,
                                on_first_audio=tracker.audio_published)
        super().__init__(settings, tracker=tracker, mic=MicrophoneInput(sample_rate=MIC_RATE),
                         speaker=speaker)

    @property
    def session(self):  # type: ignore[no-untyped-def]
        return self.pipeline.session

    async def start(self, room: rtc.Room | None = None) -> None:
        warm_transcript_timing()  # once per process, before any reply (warmup.py)
        p = self.pipeline
        warm_stt = asyncio.ensure_future(p.stt.prewarm_async())  # beside the phrases
        if self.settings.starter_cache:
            await p.cache.warm(p.tts, starter_phrases(self.settings))
        await warm_stt
        await super().start(room)

    async def __aenter__(self) -> DirectSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- driving it ------------------------------------------------------------------------------
    def say_user(self, pcm16k: np.ndarray | bytes) -> asyncio.Future[tuple[float, float]]:
        """Speak into the microphone (real time); resolves to (start, end) perf times."""
        return self.mic.play(pcm16k)

    async def wait_state(self, state: DuplexState, timeout: float) -> float:
        """Wait until the duplex controller enters `state`; returns the perf time."""
        async with asyncio.timeout(timeout):
            while self.duplex.state != state:
                await asyncio.sleep(0.005)
        return time.perf_counter()

    async def wait_until_quiet(self, timeout: float = 60.0, quiet_s: float = 1.0) -> None:
        """Until the agent is LISTENING with nothing playing for `quiet_s` seconds."""
        deadline = time.perf_counter() + timeout
        quiet_since: float | None = None
        while time.perf_counter() < deadline:
            busy = self.duplex.state != DuplexState.LISTENING or self.speaker.playing
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.perf_counter()
            elif time.perf_counter() - quiet_since >= quiet_s:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"agent not quiet after {timeout:.0f} s (state {self.duplex.state})")

    async def user_turn(self, pcm16k: np.ndarray | bytes, timeout: float = 60.0,
                        quiet_s: float = 1.0) -> bool:
        """One user turn: speak `pcm16k`, then wait until the agent has answered and gone
        quiet. False when no reply started (see the stt/llm logs)."""
        since = len(self.duplex.transitions)
        await self.say_user(pcm16k)  # resolves when the whole clip has played
        # The turn may have ended, and the reply started or even finished, while the
        # clip's trailing silence was still playing: look for THINKING since the clip
        # started, not for the state now.
        answered = await _entered(self, DuplexState.THINKING, since, timeout)
        await self.wait_until_quiet(timeout=timeout, quiet_s=quiet_s)
        return answered

    def result(self) -> DirectResult:
        chat: list[dict[str, object]] = []
        for item in self.pipeline.session.history.items:
            if item.type == "message":
                chat.append({"role": item.role, "text": item.text_content or "",
                             "interrupted": item.interrupted})
        fb = self.pipeline.fallback.events if self.pipeline.fallback else []
        return DirectResult(
            recording=bytes(self.speaker.recording), sample_rate=self.settings.tts_sample_rate,
            turns=list(self.pipeline.tracker.history), barge_ins=list(self.duplex.barge_ins),
            transitions=list(self.duplex.transitions), chat=chat, fallback_events=list(fb),
        )


async def run_direct_session(
    settings: AgentSettings,
    *,
    user_wavs: list[str | Path],
    out_wav: str | Path | None = None,
    greet: bool = True,
    turn_timeout_s: float = 60.0,
) -> DirectResult:
    """Greet, then play each WAV as one user turn after the agent has gone quiet;
    write the agent's side (same timeline) to `out_wav`."""
    clips = [read_wav_16k(p) for p in user_wavs]
    await check_configured_voice(settings)  # an unknown AGENT_TTS_VOICE: an error, and why
    async with DirectSession(settings, greet=greet) as ds:
        await ds.wait_until_quiet(timeout=turn_timeout_s, quiet_s=0.5)
        for clip in clips:
            if not await ds.user_turn(clip, timeout=turn_timeout_s):
                log.warning("no reply to %s (see the stt/llm logs)", clip.shape)
        result = ds.result()
    if out_wav is not None:
        result.write_wav(out_wav)
    return result


async def _entered(ds: DirectSession, state: DuplexState, since: int, timeout: float) -> bool:
    """Whether the duplex controller entered `state` after its transition no. `since`
    (already, or within `timeout` seconds)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if any(st == state for _, st in ds.duplex.transitions[since:]):
            return True
        await asyncio.sleep(0.01)
    return False
