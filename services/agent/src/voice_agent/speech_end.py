"""When the user really stopped speaking: the arrival time of their last speech sample.

The VAD says "end of speech" once it has processed its hangover of silence. On a busy host
it processes audio late (frames queued, inference in the executor), so its decision time
minus the hangover is later than the real end by however far it lagged (63-213 ms with
1-2 conversations on 2 cores, up to 1.8 s with 4), and every turn's latency looked
shorter than the caller's. Here the end of speech is found in the audio and mapped back
to when that audio arrived:

- inputs stamp each frame with when its samples arrived (`stamp`): /v1/talk's SocketInput
  with when each client message was sent, on the client's real-time audio clock (a
  message the busy loop read late keeps its time), MicrophoneInput with each frame's
  real-time slot. A frame with no stamp (a LiveKit room track) counts as arriving when
  it reached the VAD;
- `TimedVAD` wraps the VAD of a conversation (the session's stream and the STT's). Its
  streams keep the recent audio with its stamps; at END_OF_SPEECH they place the end in
  the stream's audio (Silero's `samples_index` minus its `silence_duration`, the end of
  its last speech window), move it back to the end of the last 10 ms window louder than
  -45 dBFS (and 6 dB over the silence the VAD waited on) in the 300 ms before it
  (Silero's speech probability outlasts the speech: its end was 30-195 ms, mean 100, after
  the last loud sample of espeak-ng sentences), and hand the conversation a `SpeechEnd`:
  that sample's arrival, the decision's time, and the VAD's lag (the decision minus the
  arrival of the audio it decided on).

The end of speech comes after the hangover (Silero's `min_silence_duration`) of the
caller's silence, not of Silero's (`early_end`, AGENT_VAD_END=speech): Silero's speech
probability outlasts the speech by ~100 ms, so its 200 ms hangover is ~300 ms of the
caller's silence under every turn. At each window Silero hears as silence within speech,
the stream places the last speech sample as above; once the silence since it is the
hangover, the stream says END_OF_SPEECH itself (Silero still counts its own). Until
Silero's END comes the stream says what it would have said had it ended: inference events
are not speaking; speech again (Silero's probability over its activation threshold for
its minimum speech) is a new START_OF_SPEECH, whose audio its next END carries; Silero's
own END of that speech is not repeated. Where the audio gives no end (noise louder than
speech's level, no audio kept) Silero's END stands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from livekit import rtc
from livekit.agents import vad

ARRIVALS = "voice_agent.arrivals"  # frame.userdata: ((end sample in the frame, perf time), ...)
LOOKBACK_S = 0.3  # how far before the VAD's end the speech may have ended
WINDOW_S = 0.01
SPEECH_DBFS = -45.0  # a 10 ms window this loud is speech (as bench/dialogs.py counts it)
OVER_SILENCE_DB = 6.0
KEEP_S = 8.0  # audio kept behind the VAD's position: what the audio turn model hears
LOUD_AGAIN_S = 0.02  # sound this long after the end of speech: the caller goes on
MAX_SPEECH_S = 60.0  # an utterance's audio kept for the END the stream says (Silero's max)
VAD_RATE = 16000  # Silero's rate (load_vad), that of its samples_index
VAD_WINDOW = 512  # samples of one inference, at VAD_RATE


@dataclass(frozen=True)
class SpeechEnd:
    at: float  # perf_counter: the last speech sample arrived
    decided: float  # perf_counter: the VAD said "end of speech"
    silence_s: float  # the silence since the last speech sample, when the VAD decided
    lag_s: float | None = None  # decided - arrival of the audio decided on (None: unknown)
    # the last KEEP_S of the stream's audio up to the VAD's decision (int16 at `rate`):
    # the turn as an audio turn model hears it (conversation/turn_end.py)
    audio: np.ndarray | None = field(default=None, repr=False, compare=False)
    rate: int = VAD_RATE
    audio_end_s: float | None = None  # where in `audio` the speech ended


def stamp(frame: rtc.AudioFrame, arrivals: Sequence[tuple[int, float]]) -> rtc.AudioFrame:
    """Mark when a frame's samples arrived: (end sample, perf time) per run, in order."""
    frame.userdata[ARRIVALS] = tuple(arrivals)
    return frame


@dataclass
class _Frame:
    start: int  # position in the stream's audio, samples
    pcm: np.ndarray
    arrivals: tuple[tuple[int, float], ...]

    @property
    def end(self) -> int:
        return self.start + len(self.pcm)


@dataclass
class _Epoch:
    """The audio between two flushes (Silero restarts its sample count at a flush)."""

    frames: deque[_Frame] = field(default_factory=deque)
    pushed: int = 0  # samples
    rate: int = VAD_RATE  # of the frames pushed (one rate a stream: Silero's rule)
    seen: int = -1  # the last samples_index of an inference the VAD reported

    def at_rate(self, vad_samples: int) -> int:
        return vad_samples * self.rate // VAD_RATE


class TimedVAD(vad.VAD):
    """A VAD whose streams report each end of speech as a `SpeechEnd` (see the module)."""

    def __init__(self, inner: vad.VAD, on_speech_end: Callable[[SpeechEnd], None],
                 early_end: bool = True) -> None:
        super().__init__(capabilities=inner.capabilities)
        self.inner = inner
        self._on_speech_end = on_speech_end
        self.early_end = early_end  # the hangover counted from the last speech sample
        # this conversation's own options (a Realtime session's silence and threshold):
        # set on its streams, live and to come, never on the process's shared VAD
        self._options: dict[str, float] = {}
        self._streams: weakref.WeakSet[TimedVADStream] = weakref.WeakSet()
        self._latest: weakref.ref[TimedVADStream] | None = None  # the session's stream
        self._followers: weakref.WeakSet[FollowingStream] = weakref.WeakSet()

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def provider(self) -> str:
        return self.inner.provider

    @property
    def min_silence_duration(self) -> float | None:
        return getattr(self.inner, "min_silence_duration", None)

    def stream(self) -> TimedVADStream:  # type: ignore[override]
        """A stream of its own (the session's): the ear's view follows it (`follow`)."""
        s = self.own_stream()
        self._latest = weakref.ref(s)
        for f in list(self._followers):
            f.adopt(s)
        return s

    def own_stream(self) -> TimedVADStream:
        s = TimedVADStream(self.inner.stream(), self._on_speech_end, self.early_end)
        if self._options:
            s.inner.update_options(**self._options)  # type: ignore[attr-defined]
        self._streams.add(s)
        return s

    def follow(self) -> FollowingStream:
        """A view of the conversation's VAD for the ear (plugins/stt.py), which hears the
        same audio as the session's stream: that stream's events, so Silero runs once a
        conversation, not twice. With no session stream open, a stream of its own."""
        return FollowingStream(self)

    def _leader(self) -> TimedVADStream | None:
        s = self._latest() if self._latest is not None else None
        return s if s is not None and not s.closed else None

    def update_options(self, **options: float) -> None:
        """Silero's `min_silence_duration` / `activation_threshold` for this conversation's
        streams only (each batched stream has its own copy: vad_batch.py)."""
        self._options.update(options)
        for s in list(self._streams):
            s.inner.update_options(**options)  # type: ignore[attr-defined]

    @property
    def streams(self) -> list[TimedVADStream]:
        return list(self._streams)

    @property
    def resuming(self) -> bool:
        """The caller went on after the last end of speech (`TimedVADStream.resuming`), on
        an open stream of this conversation."""
        return any(s.resuming for s in list(self._streams) if not s.closed)


class TimedVADStream:
    """The inner VAD stream, with the audio it was given and when that audio arrived."""

    def __init__(self, inner: vad.VADStream, on_speech_end: Callable[[SpeechEnd], None],
                 early_end: bool = True) -> None:
        self.inner = inner
        self._on_speech_end = on_speech_end
        self._early_end = early_end
        self._epochs: deque[_Epoch] = deque([_Epoch()])
        self.followers: list[FollowingStream] = []  # told each event (TimedVAD.follow)
        self.closed = False
        self._out: deque[vad.VADEvent] = deque()  # said, not yet read
        self._epoch: _Epoch | None = None  # the epoch the state below is of
        self._start = 0  # the speech under way: where its audio starts (stream samples)
        self._ended = False  # its END said here; Silero still hears speech
        self._end_pos = 0  # where that speech stopped
        self._resumed = 0.0  # speech since (s, over the activation threshold)
        self._own_start = False  # the START was said here: its END carries its audio
        self._speaking = False  # between a START and an END said (its audio is kept)
        # Silero's speech duration before the START said here (it counts from its own):
        # what reads the duration (the interruption rule) hears this speech's alone
        self._offset = 0.0

    @property
    def resuming(self) -> bool:
        """Sound again after the last end of speech: a START said since (what reads the
        events may not have read it yet), Silero hearing speech (its START needs its
        minimum speech), or the audio pushed since, which Silero may not have read yet on a
        busy host, loud again (as `last_loud` finds speech)."""
        if self._epoch is None:
            return False
        if self._speaking or (self._ended and self._resumed > 0):
            return True
        epoch = self._epochs[-1]
        if epoch is not self._epoch:
            return False
        stop = last_loud(epoch.frames, epoch.rate, epoch.pushed)
        return stop is not None and stop > self._end_pos + int(LOUD_AGAIN_S * epoch.rate)

    def push_frame(self, frame: rtc.AudioFrame) -> None:
        self.inner.push_frame(frame)
        epoch = self._epochs[-1]
        n = frame.samples_per_channel
        arrivals = frame.userdata.get(ARRIVALS) or ((n, time.perf_counter()),)
        pcm = np.frombuffer(frame.data, dtype=np.int16)[::frame.num_channels]
        epoch.rate = frame.sample_rate
        epoch.frames.append(_Frame(epoch.pushed, pcm, arrivals))
        epoch.pushed += n

    def flush(self) -> None:
        self.inner.flush()
        self._epochs.append(_Epoch())

    def end_input(self) -> None:
        self.inner.end_input()
        self._epochs.append(_Epoch())

    async def aclose(self) -> None:
        self.closed = True
        for f in self.followers:
            f.orphaned()
        self.followers.clear()
        await self.inner.aclose()

    def __aiter__(self) -> TimedVADStream:
        return self

    async def __anext__(self) -> vad.VADEvent:
        while not self._out:
            try:
                ev = await self.inner.__anext__()
            except StopAsyncIteration:
                for f in self.followers:
                    f.told(None)  # all said: its followers end with it
                raise
            epoch = self._epoch_of(ev)
            if epoch is not self._epoch:  # a flush: Silero starts afresh
                self._epoch, self._ended, self._own_start = epoch, False, False
                self._speaking = False
            self._out.extend(self._said(epoch, ev))
            pos = epoch.at_rate(ev.samples_index)
            keep_from = pos - int(KEEP_S * epoch.rate)
            if self._speaking:  # the audio its END will carry
                keep_from = min(keep_from, max(self._start,
                                               pos - int(MAX_SPEECH_S * epoch.rate)))
            while epoch.frames and epoch.frames[0].end < keep_from:
                epoch.frames.popleft()
        ev = self._out.popleft()
        for f in self.followers:
            f.told(ev)
        return ev

    def _said(self, epoch: _Epoch, ev: vad.VADEvent) -> list[vad.VADEvent]:
        """What the stream says for one of Silero's events (see the module)."""
        kind, pos = ev.type, epoch.at_rate(ev.samples_index)
        opts = getattr(self.inner, "_opts", None)
        if kind == vad.VADEventType.START_OF_SPEECH:
            self._ended, self._own_start, self._speaking = False, False, True
            self._offset = 0.0
            pad = getattr(opts, "prefix_padding_duration", 0.0)
            self._start = pos - round((ev.speech_duration + pad) * epoch.rate)
            return [ev]
        if kind == vad.VADEventType.END_OF_SPEECH:
            self._speaking = False
            if self._ended:  # said at the hangover of the caller's silence
                self._ended = False
                return []
            end = self._speech_end(epoch, pos, ev.silence_duration)
            self._on_speech_end(end)
            self._end_pos = pos - round(end.silence_s * epoch.rate)
            # the silence since the last speech sample, not since Silero's late end: what
            # reads it (the framework's endpointing delays, the ear's end of utterance,
            # Realtime's audio_end_ms) counts from when the caller stopped
            ev = dataclasses.replace(ev, silence_duration=end.silence_s)
            if self._own_start:  # Silero's audio holds the speech before its pause too
                self._own_start = False
                ev = dataclasses.replace(ev, frames=[self._audio(epoch, self._start, pos)],
                                         speech_duration=ev.speech_duration - self._offset)
            return [ev]
        if not (self._early_end and opts is not None and ev.speaking):
            return [ev]
        if self._offset and not self._ended:
            ev = dataclasses.replace(ev, speech_duration=max(
                0.0, ev.speech_duration - self._offset))
        window = VAD_WINDOW / VAD_RATE
        if self._ended:  # Silero still in the speech this stream ended
            loud = ev.probability >= opts.activation_threshold
            self._resumed = self._resumed + window if loud else 0.0
            quiet = (pos - self._end_pos) / epoch.rate
            if self._resumed < opts.min_speech_duration:
                return [dataclasses.replace(
                    ev, speaking=False, speech_duration=0.0, silence_duration=quiet,
                    raw_accumulated_speech=0.0,
                    raw_accumulated_silence=0.0 if self._resumed else quiet)]
            self._ended, self._own_start = False, True  # speech again: a START
            self._speaking = True
            self._offset = ev.speech_duration - self._resumed
            self._start = max(pos - round((self._resumed + opts.prefix_padding_duration)
                                          * epoch.rate), self._end_pos)
            start = vad.VADEvent(
                type=vad.VADEventType.START_OF_SPEECH, samples_index=ev.samples_index,
                timestamp=ev.timestamp, speech_duration=self._resumed, silence_duration=0.0,
                frames=[self._audio(epoch, self._start, pos)], speaking=True)
            return [dataclasses.replace(ev, speaking=False, speech_duration=0.0,
                                        silence_duration=0.0), start]
        if ev.probability > opts.deactivation_threshold:
            return [ev]  # speech, as Silero hears it
        stop = last_loud(epoch.frames, epoch.rate, pos)
        if stop is None:
            return [ev]  # no end in the audio (noise, or none kept): Silero's END stands
        # the caller's silence, longer than Silero's (its tail): the ear's early pass (and
        # the reply started on its words, the preflight) reads it. Only once Silero hears
        # silence: read at every gap between words (H200, 128 conversations) it started
        # passes and replies that the words after them undid, and the ear's final pass, past
        # its retries, came late (end-of-turn wait p95 319 -> 516 ms).
        quiet = (pos - stop) / epoch.rate
        silero_silence = ev.raw_accumulated_silence + window  # with this window's
        ev = dataclasses.replace(ev, raw_accumulated_silence=max(
            ev.raw_accumulated_silence, quiet))
        if quiet < opts.min_silence_duration:
            return [ev]
        self._ended, self._end_pos, self._resumed = True, stop, 0.0
        self._speaking = False
        end = self._speech_end(epoch, pos, silero_silence, stop)
        self._on_speech_end(end)
        frames = [self._audio(epoch, self._start, pos)]
        self._own_start = False
        return [ev, vad.VADEvent(
            type=vad.VADEventType.END_OF_SPEECH, samples_index=ev.samples_index,
            timestamp=ev.timestamp, speech_duration=ev.speech_duration,
            silence_duration=end.silence_s, frames=frames, speaking=False,
            inference_duration=ev.inference_duration)]

    @staticmethod
    def _audio(epoch: _Epoch, start: int, stop: int) -> rtc.AudioFrame:
        """The kept audio [start, stop) as one frame (what Silero's events carry)."""
        kept = [f for f in epoch.frames if f.end > start and f.start < stop]
        x = (np.concatenate([f.pcm for f in kept])[max(0, start - kept[0].start):
                                                   stop - kept[0].start]
             if kept else np.zeros(0, np.int16))
        return rtc.AudioFrame(x.tobytes(), epoch.rate, 1, len(x))

    def _epoch_of(self, ev: vad.VADEvent) -> _Epoch:
        """The epoch the VAD is in: it moved on at a flush when its count went back (or an
        inference repeated an index); an epoch shorter than a window gave no inference."""
        while len(self._epochs) > 1:
            first = self._epochs[0]
            restarted = ev.samples_index < first.seen or (
                ev.samples_index == first.seen and ev.type == vad.VADEventType.INFERENCE_DONE)
            if not restarted and first.at_rate(VAD_WINDOW) <= first.pushed:
                break
            self._epochs.popleft()
        epoch = self._epochs[0]
        epoch.seen = ev.samples_index
        return epoch

    def _speech_end(self, epoch: _Epoch, pos: int, silero_silence_s: float,
                    stop: int | None = None) -> SpeechEnd:
        """The end of speech the VAD decided on at `pos` (the audio it has read), after
        `silero_silence_s` of its own silence; `stop`: the last speech sample, if the
        stream already placed it (its own END)."""
        decided = time.perf_counter()
        rate, frames = epoch.rate, list(epoch.frames)
        vad_end = pos - round(silero_silence_s * rate)  # its last speech window's end
        end = stop if stop is not None else (loud_end(frames, rate, vad_end, pos) or vad_end)
        at, heard = arrival(frames, end - 1), arrival(frames, pos - 1)
        audio = recent_audio(frames, pos)
        kept = {"audio": audio, "rate": rate, "audio_end_s": None if audio is None
                else max(0.0, (len(audio) - (pos - end)) / rate)}
        silence_s = (pos - end) / rate
        if at is None or heard is None:  # audio not kept: the decision, back-dated
            return SpeechEnd(at=decided - silence_s, decided=decided, silence_s=silence_s,
                             **kept)
        return SpeechEnd(at=at, decided=decided, silence_s=silence_s, lag_s=decided - heard,
                         **kept)


class FollowingStream:
    """The ear's view of a conversation's VAD (`TimedVAD.follow`): the events of the
    session's stream, which hears the same audio; its own frames are not pushed (they are
    that audio). While there is no session stream (before it opens, after it closed), a
    stream of its own, which hears what this one is pushed."""

    def __init__(self, vad_: TimedVAD) -> None:
        self._vad = vad_
        self._events: asyncio.Queue[vad.VADEvent | None] = asyncio.Queue()
        self._leader: TimedVADStream | None = None
        self._own: TimedVADStream | None = None
        self._pump: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None  # its own stream, on adopting
        self._ended = False
        vad_._followers.add(self)
        leader = vad_._leader()
        if leader is not None:
            self.adopt(leader)
        else:
            self._go_own()

    @property
    def following(self) -> bool:
        return self._leader is not None

    def adopt(self, leader: TimedVADStream) -> None:
        """Follow the session's stream (opened after this one)."""
        if self._ended or self._leader is leader:
            return
        if self._pump is not None:
            self._pump.cancel()
        if self._own is not None:
            own, self._own = self._own, None
            self._closing = asyncio.ensure_future(own.aclose())
        self._leader = leader
        leader.followers.append(self)

    def told(self, ev: vad.VADEvent | None) -> None:
        self._events.put_nowait(ev)

    def orphaned(self) -> None:
        """The session's stream closed: a stream of its own from now on."""
        self._leader = None
        if self._ended:
            self._events.put_nowait(None)
        else:
            self._go_own()

    def _go_own(self) -> None:
        own = self._own = self._vad.own_stream()

        async def pump() -> None:
            try:
                async for ev in own:
                    self._events.put_nowait(ev)
            finally:
                if self._ended:
                    self._events.put_nowait(None)

        self._pump = asyncio.ensure_future(pump())

    def push_frame(self, frame: rtc.AudioFrame) -> None:
        if self._own is not None:
            self._own.push_frame(frame)

    def flush(self) -> None:
        if self._own is not None:  # the session's stream is not the ear's to reset
            self._own.flush()

    def end_input(self) -> None:
        """No more audio from the ear: this view ends when the stream it hears has said
        all it heard (the session's ends with the session)."""
        self._ended = True
        if self._own is not None:
            self._own.end_input()  # its pump ends this view once all is said

    async def aclose(self) -> None:
        self._ended = True
        if self._leader is not None and self in self._leader.followers:
            self._leader.followers.remove(self)
        self._leader = None
        if self._pump is not None:
            self._pump.cancel()
        if self._own is not None:
            await self._own.aclose()
        if self._closing is not None:
            await self._closing
        self._events.put_nowait(None)

    def __aiter__(self) -> FollowingStream:
        return self

    async def __anext__(self) -> vad.VADEvent:
        ev = await self._events.get()
        if ev is None:
            self._events.put_nowait(None)  # stays ended for any later read
            raise StopAsyncIteration
        return ev


def recent_audio(frames: Sequence[_Frame], pos: int) -> np.ndarray | None:
    """The kept audio up to sample `pos` (the VAD's position), oldest first."""
    kept = [f for f in frames if f.start < pos]
    if not kept:
        return None
    x = np.concatenate([f.pcm for f in kept])
    return x[:pos - kept[0].start]


def arrival(frames: Sequence[_Frame], sample: int) -> float | None:
    """When a sample (its position in the stream) arrived; None if not kept."""
    for f in reversed(frames):
        if f.start <= sample < f.end:
            k = sample - f.start
            return next((at for end, at in f.arrivals if k < end), f.arrivals[-1][1])
    return None


def _levels(frames: Sequence[_Frame], rate: int, lo: int, hi: int) -> np.ndarray | None:
    """The level (dBFS) of each 10 ms window in [lo, hi) (on the stream's 10 ms grid);
    None if that audio is not all kept. Walks from the newest frame back: the deque holds
    up to a minute, and this runs once a window."""
    win = int(rate * WINDOW_S)
    kept = []
    for f in reversed(frames):
        if f.end <= lo:
            break
        if f.start < hi:
            kept.append(f)
    kept.reverse()
    if win == 0 or hi - lo < win or not kept or kept[0].start > lo:
        return None
    x = np.concatenate([f.pcm for f in kept])[lo - kept[0].start:hi - kept[0].start]
    x = x[:len(x) // win * win].astype(np.float64) / 32768.0
    return 10 * np.log10(np.mean(x.reshape(-1, win) ** 2, axis=1) + 1e-20)


def _last_over(level: np.ndarray, threshold: float, lo: int, win: int) -> int | None:
    loud = np.flatnonzero(level >= max(SPEECH_DBFS, threshold))
    return None if len(loud) == 0 else lo + (int(loud[-1]) + 1) * win


def last_loud(frames: deque[_Frame], rate: int, pos: int) -> int | None:
    """The end of the last 10 ms window of speech in the LOOKBACK_S before `pos`, loud by
    SPEECH_DBFS and by OVER_SILENCE_DB over the quietest fifth of those windows (Silero's
    silence may begin within a word's quiet tail, so every window up to `pos` counts);
    None if none is (noise as loud as speech), or the audio is not kept."""
    win = int(rate * WINDOW_S)
    if win == 0:
        return None
    lo = -(-(pos - int(LOOKBACK_S * rate)) // win) * win
    level = _levels(frames, rate, lo, pos // win * win)
    if level is None:
        return None
    return _last_over(level, float(np.percentile(level, 20)) + OVER_SILENCE_DB, lo, win)


def loud_end(frames: list[_Frame], rate: int, vad_end: int, pos: int) -> int | None:
    """The end of the last 10 ms window of speech in the LOOKBACK_S before `vad_end`, loud
    by SPEECH_DBFS and by OVER_SILENCE_DB over the silence [vad_end, pos) (windows on the
    stream's 10 ms grid); None if none is."""
    win = int(rate * WINDOW_S)
    if not frames or win == 0:
        return None
    lo = -(-max(vad_end - int(LOOKBACK_S * rate), frames[0].start) // win) * win
    level = _levels(frames, rate, lo, pos // win * win)
    if level is None:
        return None
    n_speech = -(-(vad_end - lo) // win)  # the windows that start before the VAD's end
    floor = float(np.median(level[n_speech:])) if len(level) > n_speech else -120.0
    return _last_over(level[:n_speech], floor + OVER_SILENCE_DB, lo, win)
