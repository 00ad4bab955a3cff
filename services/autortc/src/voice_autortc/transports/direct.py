"""The `direct` transport: the real agent (voice_agent.direct.DirectSession), no LiveKit.

The agent's own real-time devices stand in for the room: the user bot is its
`MicrophoneInput` (our clip played in real time, so Silero VAD and endpointing see a
live signal), the probe is its `SpeakerOutput` (frames played out on a 20 ms wall
clock; each tick's time is the frame's arrival). Between the agent and the speaker
we tap the frames the session hands over: that is pre-RTC (what the TTS produced);
what the speaker plays is post-RTC. With no network in between they should match,
which is exactly what the clean cases must show; the P1 faults break the link after.

Reply slicing (seed D9): reply_start = first agent frame played after the user's EoT,
reply_end = the end of that playback segment (the speaker's playback_finished, or the
barge-in's clear). The greeting and any later reply stay out of the slice.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio import to_float
from ..cases import Case
from ..faults import Received
from ..speech import UserClip
from .base import ERROR, NO_REPLY, OK, POST_SILENT, PRE_MISSING, Capture


@dataclass
class _Tap:
    """Frames handed to the speaker, grouped into playback segments."""

    # Each segment: the frames (capture time, pcm) the session handed over, in order.
    segments: list[list[tuple[float, bytes]]] = field(default_factory=list)
    open: bool = False
    finished: list[tuple[float, bool]] = field(default_factory=list)  # (t, interrupted)


def _install_tap(speaker: Any) -> _Tap:
    # Instance attributes shadow the methods: the session's audio chain calls these.
    tap = _Tap()
    capture, flush, clear = speaker.capture_frame, speaker.flush, speaker.clear_buffer
    finished = speaker.on_playback_finished

    async def capture_frame(frame: Any) -> None:
        if not tap.open:
            tap.segments.append([])
            tap.open = True
        tap.segments[-1].append((time.perf_counter(), bytes(frame.data)))
        await capture(frame)

    def on_flush() -> None:
        tap.open = False
        flush()

    def on_clear() -> None:
        tap.open = False
        clear()

    def on_finished(*args: Any, **kwargs: Any) -> None:
        tap.finished.append((time.perf_counter(), bool(kwargs.get("interrupted", False))))
        finished(*args, **kwargs)

    speaker.capture_frame = capture_frame
    speaker.flush = on_flush
    speaker.clear_buffer = on_clear
    speaker.on_playback_finished = on_finished
    return tap


async def run_case(case: Case, clip: UserClip, *, agent_settings: Any, trace_id: str,
                   barge_clip: UserClip | None = None, greet: bool = True,
                   valid_rms: float = 0.01) -> Capture:
    """One case over a fresh DirectSession (fresh gRPC channels, fresh chat context)."""
    from voice_agent.direct import DirectSession  # the agent package (Makefile installs it)

    cap = Capture(case_id=case.id, trace_id=trace_id, rate=agent_settings.tts_sample_rate,
                  pre_rate=agent_settings.tts_sample_rate)
    timeout = case.expect.reply_timeout_s
    ds = DirectSession(agent_settings, greet=greet)
    tap = _install_tap(ds.speaker)
    try:
        async with ds:
            await ds.wait_until_quiet(timeout=timeout, quiet_s=0.3)
            device_start = _mic_clock(ds.mic)
            played = ds.say_user(clip.pcm16())
            barge = asyncio.create_task(_barge_in(ds, case, clip, barge_clip, played, cap))
            start, _end = await played
            # EoT on the microphone's device clock (when the user stopped talking), not
            # when a lagging consumer pulled the frame: the lag is the agent's latency.
            cap.eot = (device_start if device_start is not None else start) \
                + clip.end_of_speech_s
            if not await _replied(ds, cap.eot, timeout):
                cap.notes.append(f"no agent audio within {timeout:.0f} s of the EoT")
            await barge
            try:
                await ds.wait_until_quiet(timeout=timeout, quiet_s=0.8)
            except TimeoutError as e:  # keep what was captured: a too-long reply is data
                cap.notes.append(f"reply did not end in time: {e}")
            result = ds.result()
    except Exception as e:  # the report shows it; the suite goes on with the next case
        cap.status, cap.error = ERROR, f"{type(e).__name__}: {e}"
        return cap

    cap.agent_turns = [t for t in result.turns if t.get("kind") == "user"]
    cap.transcript = list(result.chat)
    if result.barge_ins:
        b = result.barge_ins[0]
        cap.barge_in = {"cancel_to_silence_ms": round(b.cancel_to_silence_s * 1000, 2)}
    _slice(cap, ds.speaker, tap, valid_rms)
    return cap


def _mic_clock(mic: Any) -> float | None:
    """Device time at which queued speech starts: the next frame the microphone fills
    is delivered at t0 + n * frame and holds the 20 ms before that. Reads the agent's
    MicrophoneInput clock; None if it has not started."""
    t0, n, frame_s = getattr(mic, "_t0", None), getattr(mic, "_n", None), \
        getattr(mic, "_frame_s", None)
    if t0 is None or n is None or frame_s is None:
        return None
    return float(t0 + (n - 1) * frame_s)


def _sender_lateness(seg: list[tuple[float, bytes]], play_start: float,
                     rate: int) -> dict[str, float]:
    """Replay the speaker's clock over the frames' capture times: a frame handed over
    after its playout moment means the sender (TTS + agent) was behind real time, so
    the gap it caused is the sender's, not the link's. (Direct transport only.)"""
    clock, late, late_s = play_start, 0, 0.0
    for t, pcm in seg:
        if t > clock + 0.005:
            late += 1
            late_s += t - clock
            clock = t
        clock += len(pcm) / 2 / rate
    span = seg[-1][0] - seg[0][0]
    dur = sum(len(p) for _, p in seg) / 2 / rate
    return {"sender_late_frames": float(late), "sender_late_ms": round(late_s * 1000, 1),
            "sender_delivery_rtf": round(span / dur, 3) if dur else -1.0}


async def _replied(ds: Any, eot: float, timeout: float) -> bool:
    """Wait for the first agent frame played after the EoT (the reply has begun)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if any(t.audible and t.at >= eot for t in ds.speaker.ticks[-50:]):
            return True
        await asyncio.sleep(0.01)
    return False


async def _barge_in(ds: Any, case: Case, clip: UserClip, barge_clip: UserClip | None,
                    played: asyncio.Future[tuple[float, float]], cap: Capture) -> None:
    """Speak the barge-in utterance `after_reply_ms` after the reply became audible."""
    if barge_clip is None or case.input.barge_in is None:
        return
    start, _ = await asyncio.shield(played)
    eot = start + clip.end_of_speech_s
    deadline = time.perf_counter() + case.expect.reply_timeout_s
    while time.perf_counter() < deadline:
        if any(t.audible and t.at >= eot for t in ds.speaker.ticks):
            break
        await asyncio.sleep(0.01)
    else:
        cap.notes.append("no reply to barge into")
        return
    await asyncio.sleep(case.input.barge_in.after_reply_ms / 1000)
    t0, _ = await ds.say_user(barge_clip.pcm16())
    cap.barge_in = {"barge_in_at": t0}


def _slice(cap: Capture, speaker: Any, tap: _Tap, valid_rms: float) -> None:
    ticks = list(speaker.ticks)
    rec = to_float(bytes(speaker.recording))
    fs = speaker.frame_samples
    cap.full = rec
    eot = cap.eot or 0.0
    first = next((i for i, t in enumerate(ticks) if t.audible and t.at >= eot), None)
    if first is None:
        cap.status = NO_REPLY
        return
    cap.reply_start = ticks[first].at
    ends = [t for t, _ in tap.finished if t > cap.reply_start]
    cap.reply_end = ends[0] if ends else ticks[-1].at + fs / cap.rate
    last = max((i for i, t in enumerate(ticks[: len(rec) // fs]) if t.at < cap.reply_end),
               default=first)
    reply = rec[first * fs : (last + 1) * fs]
    arrivals = [t.at for t in ticks[first : last + 1]]
    cap.reply = Received(cap.rate, reply, arrivals, fs)
    loud = [i for i in range(first, last + 1)
            if np.sqrt(np.mean(np.square(rec[i * fs : (i + 1) * fs]))) >= 10 ** (-50 / 20)]
    cap.first_audible = ticks[loud[0]].at if loud else None

    # pre-RTC: the first segment handed to the speaker after EoT is this reply's audio.
    seg = next((s for s in tap.segments if s and s[0][0] >= eot), None)
    if seg:
        cap.sender = _sender_lateness(seg, cap.reply_start, cap.pre_rate)
        pre = to_float(b"".join(pcm for _, pcm in seg))
        if cap.barge_in is not None:
            pre = pre[: len(reply)]  # interrupted: only what could be heard is comparable
        cap.pre = pre
    after = rec[first * fs :]  # the greeting must not make a silent reply valid
    full_rms = float(np.sqrt(np.mean(np.square(after)))) if len(after) else 0.0
    reply_rms = float(np.sqrt(np.mean(np.square(reply)))) if len(reply) else 0.0
    # seed 003 13.3: valid if either the reply or the full recording is audible
    if max(reply_rms, full_rms) < valid_rms:
        cap.status = POST_SILENT
    elif cap.pre is None:
        cap.status = PRE_MISSING
    else:
        cap.status = OK
