"""The `direct` transport: the real agent (voice_agent.direct.DirectSession), no LiveKit.

The agent's own real-time devices stand in for the room: the user bot is its
`MicrophoneInput` (our clip played in real time, so Silero VAD and endpointing see a
live signal); its `SpeakerOutput` is the sender (frames played out on a 20 ms wall
clock, as a room track publishes them). We watch both through the agent's public
hooks only: the speaker's `OutputTap` and the microphone's read-only delivery clock.
Each frame the speaker plays goes over `link.Link` (the
network: clean, or impaired live as the case's `link` says) to `link.Receiver`, the
listener: it stamps arrivals on its own clock and plays out through its own jitter
buffer. pre-RTC = what the speaker sent for the reply; post-RTC = what the receiver
played. On a clean link they match sample for sample, which the clean cases must show.

Reply slicing (seed D9): the reply is the first playback segment still playing at the
listener after the user's EoT, from its first to its last frame there. The greeting
and any later reply stay out of the slice. Also measured here, on the listener's side:
agent audio while the user was still speaking (a mid-sentence reply) and, on barge-in,
the last audible sample of the reply, what of it was never played and its longest pause.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from voice_agent.audio_io import MicrophoneInput, OutputTap

from ..audio import to_float
from ..audio_metrics import SILENCE_DBFS, envelope_db
from ..cases import Case
from ..faults import Received
from ..link import Impairment, Link, Receiver, RxTick
from ..speech import UserClip
from .base import ERROR, NO_REPLY, OK, POST_SILENT, PRE_MISSING, Capture


@dataclass
class _SenderTap(OutputTap):
    """On the agent's speaker: the frames the session handed over (capture time, pcm) per
    playback segment, and every tick it played sent on over the link."""

    link: Link
    segments: dict[int, list[tuple[float, bytes]]] = field(default_factory=dict)

    def captured(self, at: float, pcm: bytes, segment: int) -> None:
        self.segments.setdefault(segment, []).append((at, pcm))

    def played(self, at: float, pcm: bytes, segment: int) -> None:
        self.link.send(at, pcm, segment)


def _impairment(case: Case) -> Impairment:
    if case.link is None:
        return Impairment()
    return Impairment(**case.link.model_dump())


async def run_case(case: Case, clip: UserClip, *, agent_settings: Any, trace_id: str,
                   barge_clip: UserClip | None = None, greet: bool = True,
                   valid_rms: float = 0.01) -> Capture:
    """One case over a fresh DirectSession (fresh gRPC channels, fresh chat context)."""
    from voice_agent.direct import DirectSession  # builds the pipeline: only when a case runs

    cap = Capture(case_id=case.id, trace_id=trace_id, rate=agent_settings.tts_sample_rate,
                  pre_rate=agent_settings.tts_sample_rate)
    timeout = case.expect.reply_timeout_s
    ds = DirectSession(agent_settings, greet=greet)
    imp = _impairment(case)
    fs = ds.speaker.frame_samples
    rx = Receiver(frame_samples=fs, frame_s=fs / cap.rate, prebuffer_s=imp.prebuffer_ms / 1000)
    link = Link(rx, imp)
    tap = ds.speaker.tap = _SenderTap(link)
    try:
        async with ds:
            rx.start()
            try:
                await ds.wait_until_quiet(timeout=timeout, quiet_s=0.3)
                device_start = _mic_clock(ds.mic)
                link.arm()
                queued_at = time.perf_counter()
                played = ds.say_user(clip.pcm16())
                barge = asyncio.create_task(_barge_in(ds, rx, case, clip, barge_clip, played,
                                                      cap))
                start, _end = await played
                # EoT on the microphone's device clock (when the user stopped talking),
                # not when a lagging consumer pulled the frame: the lag is the agent's.
                t0 = device_start if device_start is not None else start
                cap.eot = t0 + clip.end_of_speech_s
                cap.user_speech_start = t0 + clip.speech_start_s
                if not await _replied(rx, cap.eot, timeout):
                    cap.notes.append(f"no agent audio within {timeout:.0f} s of the EoT")
                await barge
                try:
                    await ds.wait_until_quiet(timeout=timeout, quiet_s=0.8)
                except TimeoutError as e:  # keep what was captured: a long reply is data
                    cap.notes.append(f"reply did not end in time: {e}")
                result = ds.result()
            finally:
                await rx.aclose()
    except Exception as e:  # the report shows it; the suite goes on with the next case
        cap.status, cap.error = ERROR, f"{type(e).__name__}: {e}"
        return cap

    cap.agent_turns = [t for t in result.turns if t.get("kind") == "user"]
    cap.transcript = list(result.chat)
    if result.barge_ins:
        b = result.barge_ins[0]
        cap.barge_in = {"cancel_to_silence_ms": round(b.cancel_to_silence_s * 1000, 2)}
    cap.link = {"link_sent": float(len(link.sent)), "link_dropped": float(len(link.dropped)),
                "rx_lost": float(rx.lost), "rx_late": float(rx.late)}
    _slice(cap, rx, link, tap, valid_rms, queued_at)
    return cap


def _mic_clock(mic: MicrophoneInput) -> float | None:
    """Device time at which queued speech starts: the next frame the microphone fills
    is delivered at t0 + n * frame and holds the frame before that. None if it has not
    started."""
    if mic.t0 is None:
        return None
    return mic.t0 + (mic.frames_sent - 1) * mic.frame_s


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


async def _replied(rx: Receiver, eot: float, timeout: float) -> bool:
    """Wait for the first agent frame played at the listener after the EoT."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if any(t.audible and t.at >= eot for t in rx.ticks[-50:]):
            return True
        await asyncio.sleep(0.01)
    return False


async def _barge_in(ds: Any, rx: Receiver, case: Case, clip: UserClip,
                    barge_clip: UserClip | None, played: asyncio.Future[tuple[float, float]],
                    cap: Capture) -> None:
    """Speak the barge-in utterance `after_reply_ms` after the reply became audible at
    the listener; its speech onset (microphone device clock) is what the cut is timed
    from."""
    if barge_clip is None or case.input.barge_in is None:
        return
    start, _ = await asyncio.shield(played)
    eot = start + clip.end_of_speech_s
    deadline = time.perf_counter() + case.expect.reply_timeout_s
    while time.perf_counter() < deadline:
        if any(t.audible and t.at >= eot for t in rx.ticks):
            break
        await asyncio.sleep(0.01)
    else:
        cap.notes.append("no reply to barge into")
        return
    await asyncio.sleep(case.input.barge_in.after_reply_ms / 1000)
    device = _mic_clock(ds.mic)
    t0, _ = await ds.say_user(barge_clip.pcm16())
    cap.barge_onset = (device if device is not None else t0) + barge_clip.speech_start_s
    cap.barge_end = cap.barge_onset + barge_clip.end_of_speech_s - barge_clip.speech_start_s


def _loud(pcm: np.ndarray) -> bool:
    return bool(len(pcm)) and float(np.sqrt(np.mean(np.square(pcm)))) >= 10 ** (
        SILENCE_DBFS / 20)


def _reply_segment(ticks: list[RxTick], eot: float) -> int | None:
    """The first segment still playing at the listener after the EoT."""
    return next((t.segment for t in ticks if t.audible and t.at >= eot), None)


def _slice(cap: Capture, rx: Receiver, link: Link, tap: _SenderTap, valid_rms: float,
           queued_at: float) -> None:
    rec = to_float(bytes(rx.recording))
    fs = rx.frame_samples
    ticks = rx.ticks[: len(rec) // fs]
    cap.full = rec
    eot = cap.eot or 0.0
    frame = [rec[i * fs : (i + 1) * fs] for i in range(len(ticks))]
    if cap.user_speech_start is not None:  # agent audio while the user still spoke
        # Only segments begun after the user's speech was queued: a lagging microphone
        # consumer puts the speech's device times in the past, over the greeting's tail.
        began = {}
        for t in ticks:
            if t.audible:
                began.setdefault(t.segment, t.at)
        cap.agent_audio_during_user = next(
            (t.at for i, t in enumerate(ticks)
             if t.audible and began[t.segment] > queued_at
             and cap.user_speech_start < t.at < eot and _loud(frame[i])), None)
    seg = _reply_segment(ticks, eot)
    if seg is None:
        cap.status = NO_REPLY
        return
    mine = [i for i, t in enumerate(ticks) if t.segment == seg]
    first, last = mine[0], mine[-1]
    cap.reply_start = ticks[first].at
    cap.reply_end = ticks[last].at + rx.frame_s
    reply = rec[first * fs : (last + 1) * fs]
    arrivals = sorted(at for at, p in rx.arrivals if p.segment == seg)
    cap.reply = Received(cap.rate, reply, arrivals, fs)
    loud = [i for i in range(first, last + 1) if _loud(frame[i])]
    cap.first_audible = ticks[loud[0]].at if loud else None
    cap.reply_last_audible = _last_audible(reply, ticks[first : last + 1], fs, cap.rate)

    # pre-RTC: what the speaker sent for this reply (before the link).
    sent = [p for p in link.sent if p.segment == seg]
    cap.pre = to_float(b"".join(p.pcm for p in sent))
    if seg in tap.segments and sent:
        cap.sender = _sender_lateness(tap.segments[seg], sent[0].sent_at, cap.pre_rate)
    if cap.barge_onset is not None and seg in tap.segments:
        taken = sum(len(pcm) for _, pcm in tap.segments[seg])
        cap.reply_unplayed_ms = round((taken - sum(len(p.pcm) for p in sent)) / 2
                                      / cap.pre_rate * 1000, 1)
        times = [p.sent_at for p in sent]
        k = next((i for i, t in enumerate(times) if t >= cap.barge_onset), len(times))
        after = times[max(0, k - 1):]  # from the frame playing when the user began
        cap.reply_pause_ms = round(float(np.max(np.diff(after))) * 1000, 1) if len(
            after) > 1 else 0.0
    if cap.barge_end is not None:
        cap.reply_after_barge_ms = round(sum(
            1 for i in mine if ticks[i].at >= cap.barge_end and _loud(frame[i]))
            * rx.frame_s * 1000, 1)
    if len(sent) > 1:
        # The sender's own longest pause between frames (its event loop held up, or the
        # TTS late): an arrival gap this long was there before the link.
        cap.sender["sender_gap_max_ms"] = round(float(np.max(np.diff(
            [p.sent_at for p in sent]))) * 1000, 2)
    after = rec[first * fs :]  # the greeting must not make a silent reply valid
    full_rms = float(np.sqrt(np.mean(np.square(after)))) if len(after) else 0.0
    reply_rms = float(np.sqrt(np.mean(np.square(reply)))) if len(reply) else 0.0
    # seed 003 13.3: valid if either the reply or the full recording is audible
    if max(reply_rms, full_rms) < valid_rms:
        cap.status = POST_SILENT
    elif not len(cap.pre):
        cap.status = PRE_MISSING
    else:
        cap.status = OK


def _last_audible(reply: np.ndarray, ticks: list[RxTick], fs: int, rate: int) -> float | None:
    """Listener time of the end of the reply's last audible 10 ms window."""
    env = envelope_db(reply, rate)
    idx = np.flatnonzero(env >= SILENCE_DBFS)
    if not len(idx):
        return None
    end = (int(idx[-1]) + 1) * (rate // 100)  # samples into the reply
    k = min((end - 1) // fs, len(ticks) - 1)
    return ticks[k].at + (end - k * fs) / rate
