"""The user's end of speech in arrival time (speech_end.py): real Silero on espeak-ng
speech whose frames are stamped as arriving in real time, read by the VAD late.

The VAD's decision minus its hangover (the old stamping) would put the end of speech as
late as the VAD ran; the located end is the arrival of the last speech sample however
late the VAD decides, and the turn's latency runs from there.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from livekit import rtc
from livekit.agents.vad import VADEventType as vad_events
from voice_agent.conversation.parts import load_vad
from voice_agent.metrics import REGISTRY, TurnTracker
from voice_agent.settings import AgentSettings
from voice_agent.speech_end import SpeechEnd, TimedVAD, stamp

from .backends import espeak

FRAME = 320  # 20 ms at 16 kHz


def true_end(pcm: np.ndarray) -> int:
    """One past the last sample of the last 10 ms window over -45 dBFS (bench/dialogs.py)."""
    x = pcm[: len(pcm) // 160 * 160].astype(np.float64) / 32768
    level = 10 * np.log10(np.mean(x.reshape(-1, 160) ** 2, axis=1) + 1e-20)
    return (int(np.flatnonzero(level >= -45)[-1]) + 1) * 160


def frames(pcm: np.ndarray, t0: float | None) -> list[rtc.AudioFrame]:
    """20 ms frames, stamped as arriving in real time from `t0` (None: no stamps)."""
    out = []
    for k in range(0, len(pcm) - FRAME + 1, FRAME):
        f = rtc.AudioFrame(pcm[k:k + FRAME].tobytes(), 16000, 1, FRAME)
        out.append(f if t0 is None else stamp(f, ((FRAME, t0 + (k + FRAME) / 16000),)))
    return out


async def run(vad: TimedVAD, batches: list[list[rtc.AudioFrame]]) -> None:
    """Push every frame at once (the VAD runs behind: seconds late), flushing between
    batches, and read the stream to its end."""
    stream = vad.stream()
    for i, batch in enumerate(batches):
        if i:
            stream.flush()
        for f in batch:
            stream.push_frame(f)
    stream.end_input()
    async for _ in stream:
        pass
    await stream.aclose()


def clip(text: str, tmp: Path) -> np.ndarray:
    speech = espeak(text, tmp)
    return np.concatenate([np.zeros(8000, np.int16), speech, np.zeros(12800, np.int16)])


async def test_the_turn_runs_from_the_last_speech_samples_arrival_however_late_the_vad(
        tmp_path: Path) -> None:
    pcm = clip("What is the weather like today?", tmp_path)
    # the audio arrived in real time, its last frame 10 s ago
    t0 = time.perf_counter() - 10.0 - len(pcm) / 16000
    arrived = t0 + ((true_end(pcm) - 1) // FRAME + 1) * FRAME / 16000
    tracker = TurnTracker()
    vad = TimedVAD(load_vad(AgentSettings()), tracker.vad_speech_ended)
    await run(vad, [frames(pcm, t0)])
    end = tracker.speech_end
    assert end is not None
    # the frame holding the last speech sample, or the next (the VAD's 10 ms windows)
    assert 0.0 <= end.at - arrived <= 0.021, end.at - arrived
    assert end.lag_s is not None and end.lag_s > 10.0  # it decided 10 s after the audio
    lag0 = REGISTRY.get_sample_value("agent_vad_lag_seconds_count") or 0.0
    tracker.user_turn_ended(tracker.end_of_speech(time.perf_counter(), 0.2))
    first_audio = time.perf_counter() + 0.3
    tracker.audio_published(at=first_audio)
    rec = tracker.history[-1]
    # the old stamping (the decision - the hangover) said ~0.5 s here, not ~11 s
    assert abs(rec["eot_to_first_audio_ms"] - (first_audio - arrived) * 1000) < 21, rec
    assert rec["vad_lag_ms"] > 10_000, rec
    assert REGISTRY.get_sample_value("agent_vad_lag_seconds_count") == lag0 + 1


async def test_each_segment_between_flushes_and_unstamped_frames(tmp_path: Path) -> None:
    """A flush restarts Silero's sample count (the STT's stream is flushed every turn):
    the second utterance is placed in its own audio. Frames without a stamp (a LiveKit
    room track) arrived when they reached the VAD."""
    one = clip("I would like to book a table for two.", tmp_path)
    two = clip("And tomorrow?", tmp_path)
    ends: list[SpeechEnd] = []
    vad = TimedVAD(load_vad(AgentSettings()), ends.append)
    t1, t2 = 1000.0, 2000.0
    await run(vad, [frames(one, t1), frames(two, t2)])
    assert len(ends) >= 2
    for end, pcm, t0 in ((ends[-2], one, t1), (ends[-1], two, t2)):
        arrived = t0 + ((true_end(pcm) - 1) // FRAME + 1) * FRAME / 16000
        assert 0.0 <= end.at - arrived <= 0.021, (end, arrived)
    ends.clear()
    before = time.perf_counter()
    await run(vad, [frames(two, None)])
    assert ends and before <= ends[-1].at <= ends[-1].decided


async def test_the_end_of_speech_carries_the_silence_since_the_last_speech_sample(
        tmp_path: Path) -> None:
    """What reads the VAD's end of speech (the framework's endpointing delays, the ear,
    Realtime's audio_end_ms) counts from when the caller stopped: its silence_duration is
    the audio since the last speech sample, longer than Silero's own (its probability
    outlasts the speech). Silero's own end (AGENT_VAD_END=vad), here with a 100 ms
    hangover: ~200 ms after the caller stopped."""
    from livekit.agents import vad as lk_vad

    pcm = clip("What is the weather like today?", tmp_path)
    settings = AgentSettings(vad_silence_ms=100)
    vad = TimedVAD(load_vad(settings), lambda _: None, early_end=False)
    stream = vad.stream()
    for f in frames(pcm, None):
        stream.push_frame(f)
    stream.end_input()
    ends = [ev async for ev in stream if ev.type == lk_vad.VADEventType.END_OF_SPEECH]
    await stream.aclose()
    assert len(ends) == 1
    ev = ends[0]
    decided_at = ev.samples_index / 16000  # the audio the VAD had read when it decided
    since_last_speech = decided_at - true_end(pcm) / 16000
    # the 10 ms grid on which the end is found
    assert abs(ev.silence_duration - since_last_speech) <= 0.011, (ev, since_last_speech)
    assert 0.1 <= ev.silence_duration < 0.4, ev  # over Silero's 100 ms: its tail counted


async def test_the_ears_view_hears_the_sessions_stream_so_silero_runs_once(
        tmp_path: Path) -> None:
    """The ear's VAD view (TimedVAD.follow, plugins/stt.py) gets the session's stream's
    events, the same as a stream of its own would give, with one Silero stream a
    conversation instead of two; opened before the session's stream, it has its own
    until that one opens, then follows it; once that closes, it has its own again."""
    pcm = np.concatenate([clip("Hello there.", tmp_path), clip("How are you?", tmp_path)])
    ends: list[SpeechEnd] = []
    vad = TimedVAD(load_vad(AgentSettings()), ends.append)

    async def kinds(stream: object, push: bool) -> list[tuple[str, int]]:
        async def feed() -> None:
            for f in frames(pcm, None):
                if push:
                    stream.push_frame(f)  # type: ignore[attr-defined]
                await asyncio.sleep(0)
            stream.end_input()  # type: ignore[attr-defined]

        feeder = asyncio.create_task(feed())
        got = [(ev.type.name, ev.samples_index) async for ev in stream  # type: ignore[attr-defined]
               if ev.type != vad_events.INFERENCE_DONE]
        await feeder
        return got

    alone = await kinds(vad.own_stream(), push=True)
    assert [k for k, _ in alone].count("END_OF_SPEECH") == 2
    early = vad.follow()  # before the session's stream: its own for now
    assert not early.following
    session = vad.stream()
    ear = vad.follow()
    assert ear.following and early.following  # both on the session's stream now
    n = len(vad.streams)
    ends.clear()
    got_session, got_ear = await asyncio.gather(kinds(session, push=True),
                                                kinds(ear, push=True))
    assert got_session == got_ear == alone  # the same events as a stream of its own
    assert len(ends) == 2  # one located end per end of speech, not one per stream
    assert len(vad.streams) == n  # the ear's view opened no Silero stream
    await session.aclose()
    assert not ear.following and not early.following  # its own again
    await ear.aclose()
    await early.aclose()


async def events(vad: TimedVAD, pcm: np.ndarray) -> list:
    stream = vad.stream()
    for f in frames(pcm, None):
        stream.push_frame(f)
    stream.end_input()
    got = [ev async for ev in stream]
    await stream.aclose()
    return got


def trimmed(text: str, tmp: Path) -> np.ndarray:
    """espeak-ng's speech without its trailing silence."""
    speech = espeak(text, tmp)
    return speech[:true_end(speech)]


async def test_the_end_of_speech_comes_at_the_hangover_of_the_callers_silence(
        tmp_path: Path) -> None:
    """Silero's probability outlasts the speech by ~100 ms, so its own 200 ms hangover is
    ~300 ms of the caller's silence; the stream says END_OF_SPEECH once the caller has
    been quiet for the hangover, ~100 ms sooner, and its audio is the utterance's."""
    from livekit.agents import vad as lk_vad

    kinds = lk_vad.VADEventType
    pcm = clip("What is the weather like today?", tmp_path)
    stop = true_end(pcm) / 16000
    settings = AgentSettings()
    ends: list[SpeechEnd] = []
    said = await events(TimedVAD(load_vad(settings), ends.append), pcm)
    silero = await events(TimedVAD(load_vad(settings), lambda _: None, early_end=False), pcm)
    [end] = [ev for ev in said if ev.type == kinds.END_OF_SPEECH]
    [late] = [ev for ev in silero if ev.type == kinds.END_OF_SPEECH]
    assert [ev.type for ev in said if ev.type != kinds.INFERENCE_DONE] == [
        kinds.START_OF_SPEECH, kinds.END_OF_SPEECH]
    hangover = settings.vad_silence_ms / 1000
    # at the first window (32 ms) past the hangover of silence, on the 10 ms grid
    assert hangover <= end.samples_index / 16000 - stop <= hangover + 0.043, end
    assert abs(end.silence_duration - (end.samples_index / 16000 - stop)) <= 0.011
    assert late.samples_index - end.samples_index >= 0.05 * 16000, (late, end)
    assert len(ends) == 1 and abs(ends[0].silence_s - end.silence_duration) < 1e-9
    audio = sum(f.samples_per_channel for f in end.frames) / 16000
    assert audio >= stop - 0.5, audio  # the speech (from its start, less padding)
    after = [ev for ev in said if ev.type == kinds.INFERENCE_DONE
             and ev.samples_index > end.samples_index]
    assert after and not any(ev.speaking or ev.speech_duration for ev in after)


async def test_speech_after_that_end_is_a_new_utterance_and_a_comma_is_none(
        tmp_path: Path) -> None:
    """A pause longer than the hangover ends the speech; speech after it (Silero still in
    its own speech) is a new START, whose END carries that speech alone, and Silero's late
    END is not said again. A pause shorter than the hangover (a comma's) ends nothing."""
    from livekit.agents import vad as lk_vad

    kinds = lk_vad.VADEventType
    one, two = trimmed("I need a hotel room", tmp_path), trimmed("with a view", tmp_path)
    gap = np.zeros(int(0.25 * 16000), np.int16)  # over the hangover, within Silero's
    lead, tail = np.zeros(8000, np.int16), np.zeros(16000, np.int16)
    said = await events(TimedVAD(load_vad(AgentSettings()), lambda _: None),
                        np.concatenate([lead, one, gap, two, tail]))
    told = [ev for ev in said if ev.type != kinds.INFERENCE_DONE]
    assert [ev.type for ev in told] == [kinds.START_OF_SPEECH, kinds.END_OF_SPEECH] * 2
    first_end = (len(lead) + len(one)) / 16000
    assert told[1].samples_index / 16000 - first_end < 0.3  # before the pause is over
    second = sum(f.samples_per_channel for f in told[3].frames) / 16000
    assert len(two) / 16000 <= second < (len(two) + len(gap) + len(tail)) / 16000 + 0.1
    # the second speech's duration is its own (the interruption rule reads it), not
    # Silero's, which counts from the first START
    during = [ev.speech_duration for ev in said if ev.type == kinds.INFERENCE_DONE
              and told[2].samples_index < ev.samples_index < told[3].samples_index]
    assert during and max(during) <= len(two) / 16000 + 0.25, (max(during), len(two))
    assert told[3].speech_duration <= len(two) / 16000 + 0.35, told[3]
    comma = np.zeros(int(0.15 * 16000), np.int16)
    said = await events(TimedVAD(load_vad(AgentSettings()), lambda _: None),
                        np.concatenate([lead, one, comma, two, tail]))
    assert [ev.type for ev in said if ev.type != kinds.INFERENCE_DONE] == [
        kinds.START_OF_SPEECH, kinds.END_OF_SPEECH]


async def test_the_caller_going_on_is_seen_on_open_streams_only(tmp_path: Path) -> None:
    """After an end of speech, speech again makes the conversation's VAD `resuming` (the
    short-turn wait and a decision racing the START read it: conversation/turn_end.py);
    a stream closed mid-speech says nothing of the next one's caller."""
    from livekit.agents import vad as lk_vad

    one, two = trimmed("I need a hotel room", tmp_path), trimmed("with a view", tmp_path)
    vad = TimedVAD(load_vad(AgentSettings()), lambda _: None)
    quiet = vad.stream()  # speech, then silence: ended, and quiet since
    for f in frames(np.concatenate([np.zeros(8000, np.int16), one,
                                    np.zeros(16000, np.int16)]), None):
        quiet.push_frame(f)
    async for ev in quiet:
        if ev.type == lk_vad.VADEventType.END_OF_SPEECH:
            break
    await asyncio.sleep(0.3)  # Silero reads the rest of the silence
    assert not vad.resuming
    await quiet.aclose()
    pcm = np.concatenate([np.zeros(8000, np.int16), one, np.zeros(4800, np.int16), two])
    stream = vad.stream()
    for f in frames(pcm, None):
        stream.push_frame(f)
    seen = []
    async for ev in stream:
        seen.append(ev.type)
        if seen.count(lk_vad.VADEventType.START_OF_SPEECH) == 2:
            break  # "with a view" under way
    assert lk_vad.VADEventType.END_OF_SPEECH in seen and vad.resuming
    await stream.aclose()
    assert not vad.resuming
