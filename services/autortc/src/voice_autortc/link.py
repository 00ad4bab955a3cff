"""The network between the agent's output and the listener, live, in direct mode.

The agent's `SpeakerOutput` is the sender: every 20 ms tick that plays agent audio is a
packet sent at that moment (as an AudioSource publishes a frame). `Link` carries each
packet to the `Receiver` through the event loop, after the delay the case's
impairment gives it: packet loss (bursts), jitter (random delay, reordering), a
stall (everything sent during `stall_ms` is held, then released at once). The
impairment runs while the session plays: the reply really arrives late, lost or in a
burst, and the receiver lives through it.

`Receiver` is the listener: it stamps each packet with its own clock reading at the
moment it arrives (`arrivals`, what inter-arrival gates read), and plays out on its
own 20 ms clock through a minimal jitter buffer: a talkspurt starts `prebuffer_ms`
after its first packet arrived; a frame whose turn comes while a later one is already
here is lost (played as silence, skipped); an empty buffer mid-talkspurt is an underrun
(silence, the stream waits). Its `recording` and `ticks` are the post-RTC signal.

Neither knows about cases, metrics or the agent; the impairment arms only when told
(`arm()`), so the greeting before the user's turn crosses a clean link.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Impairment:
    loss_pct: float = 0.0  # share of packets lost, in bursts of loss_burst_frames
    loss_burst_frames: int = 1
    jitter_ms: float = 0.0  # each packet delayed by uniform(0, jitter_ms)
    stall_ms: int = 0  # packets sent in [stall_at, stall_at + stall_ms) arrive at its end
    stall_at_ms: int = 1000  # counted from the first packet sent after arm()
    prebuffer_ms: int = 20  # receiver: playout delay at a talkspurt's start
    seed: int = 1


@dataclass(frozen=True)
class Packet:
    seq: int  # contiguous over the session
    segment: int  # the sender's playback segment (one reply)
    sent_at: float
    pcm: bytes
    first: bool  # first packet of its segment (a talkspurt starts)


@dataclass
class RxTick:
    at: float  # receiver clock when this frame started playing
    audible: bool  # an agent packet played (False: silence, underrun or lost)
    segment: int | None = None
    seq: int | None = None


@dataclass
class Receiver:
    frame_samples: int
    frame_s: float
    prebuffer_s: float = 0.02
    recording: bytearray = field(default_factory=bytearray)
    ticks: list[RxTick] = field(default_factory=list)
    arrivals: list[tuple[float, Packet]] = field(default_factory=list)
    lost: int = 0  # frames whose turn came while a later one was here
    late: int = 0  # packets that arrived after their turn had passed
    _buf: dict[int, Packet] = field(default_factory=dict)
    _next: int | None = None
    _talkspurt: int | None = None  # segment being played
    _start_at: float | None = None  # playout of a new talkspurt waits until then
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def deliver(self, pkt: Packet) -> None:
        now = time.perf_counter()  # the receiver's own reading, at arrival
        self.arrivals.append((now, pkt))
        if self._next is not None and pkt.seq < self._next:
            self.late += 1
            return
        self._buf[pkt.seq] = pkt
        if pkt.first and self._start_at is None and self._talkspurt != pkt.segment:
            self._start_at = now + self.prebuffer_s
            self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._playout(), name="autortc.Receiver")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _pick(self, now: float) -> Packet | None:
        """The packet this tick plays, or None (silence); advances the buffer."""
        if self._next in self._buf:
            return self._take(self._next)
        if not self._buf:  # underrun (or idle): silence, the stream waits
            return None
        k = min(self._buf)
        pkt = self._buf[k]
        if pkt.first and pkt.segment != self._talkspurt:
            if self._start_at is not None and now + 1e-4 >= self._start_at:
                return self._take(k)
            return None
        if self._next is not None and k > self._next:  # its turn came, a later one is here
            self.lost += 1
            self._next += 1
            return None
        return self._take(k)

    def _take(self, seq: int) -> Packet:
        pkt = self._buf.pop(seq)
        self._next = seq + 1
        if pkt.segment != self._talkspurt:
            self._talkspurt, self._start_at = pkt.segment, None
        return pkt

    def _starting(self) -> bool:
        """Only a new talkspurt's packets wait in the buffer (the previous one is over)."""
        if not self._buf:
            return False
        pkt = self._buf[min(self._buf)]
        return pkt.first and pkt.segment != self._talkspurt

    async def _playout(self) -> None:
        nbytes = self.frame_samples * 2
        due = time.perf_counter()
        while True:
            if self._start_at is not None and self._start_at < due and self._starting():
                due = self._start_at  # a talkspurt starts prebuffer_s after it arrived
            delay = due - time.perf_counter()
            if delay > 0:
                self._wake.clear()
                if self._start_at is None and not self._buf:
                    # Idle: wake early if a talkspurt arrives (it may re-phase the clock).
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                        continue
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            now = time.perf_counter()
            pkt = self._pick(now)
            pcm = pkt.pcm[:nbytes].ljust(nbytes, b"\0") if pkt else bytes(nbytes)
            self.recording += pcm
            self.ticks.append(RxTick(now, pkt is not None, pkt.segment if pkt else None,
                                     pkt.seq if pkt else None))
            due += self.frame_s


class Link:
    """Sender side: `send()` is called on each speaker tick that plays agent audio."""

    def __init__(self, receiver: Receiver, impairment: Impairment | None = None) -> None:
        self.rx = receiver
        self.imp = impairment or Impairment()
        self.sent: list[Packet] = []
        self.dropped: list[int] = []  # seqs lost on the link
        self._stalled: list[Packet] = []  # held by the stall, released together in order
        self._rng = random.Random(self.imp.seed)
        self._armed_at: float | None = None
        self._first_after_arm: float | None = None
        self._burst_left = 0
        self._segment: int | None = None

    def arm(self) -> None:
        """From now on the impairment applies (the user's turn and the reply)."""
        self._armed_at = time.perf_counter()

    def send(self, at: float, pcm: bytes, segment: int) -> None:
        pkt = Packet(len(self.sent), segment, at, pcm, first=segment != self._segment)
        self._segment = segment
        self.sent.append(pkt)
        delay = self._delay(pkt) if self._armed_at is not None else 0.0
        if delay is None:
            self.dropped.append(pkt.seq)
            return
        loop = asyncio.get_running_loop()
        end = self._stall_end(pkt) if self._armed_at is not None else None
        if end is not None and delay <= end - pkt.sent_at:
            # One release for the whole stall, in the order sent: timers due at the same
            # moment may fire in any order, and the receiver took a reordered pair for a
            # lost packet (a stalled link delays, it does not reorder).
            if not self._stalled:
                loop.call_later(delay, self._release)
            self._stalled.append(pkt)
            return
        if delay <= 0:
            loop.call_soon(self.rx.deliver, pkt)
        else:
            loop.call_later(delay, self.rx.deliver, pkt)

    def _delay(self, pkt: Packet) -> float | None:
        """Seconds until the packet arrives; None: lost."""
        imp = self.imp
        if self._first_after_arm is None:
            self._first_after_arm = pkt.sent_at
        if imp.loss_pct > 0:
            if self._burst_left == 0:
                # Bursts start so that loss_pct of all packets are lost on average.
                p = imp.loss_pct / 100.0
                start_p = p / (imp.loss_burst_frames * (1 - p) + p)
                if self._rng.random() < start_p:
                    self._burst_left = imp.loss_burst_frames
            if self._burst_left > 0:
                self._burst_left -= 1
                return None
        delay = self._rng.uniform(0.0, imp.jitter_ms / 1000.0) if imp.jitter_ms > 0 else 0.0
        end = self._stall_end(pkt)
        if end is not None:
            delay = max(delay, end - pkt.sent_at)
        return delay

    def _stall_end(self, pkt: Packet) -> float | None:
        """When the stall that holds `pkt` ends (None: none holds it)."""
        imp = self.imp
        if imp.stall_ms <= 0 or self._first_after_arm is None:
            return None
        s0 = self._first_after_arm + imp.stall_at_ms / 1000.0
        s1 = s0 + imp.stall_ms / 1000.0
        return s1 if s0 <= pkt.sent_at < s1 else None

    def _release(self) -> None:
        held, self._stalled = self._stalled, []
        for pkt in held:
            self.rx.deliver(pkt)
