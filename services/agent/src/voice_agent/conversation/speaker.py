"""A socket client's loudspeaker, seen from the agent (`SocketSpeaker`): the paced ticks of
a reply's audio go to the door's `send` as they leave (the client plays as it receives), so
the playback position the framework reads, and cuts a reply's words by, is what was sent.
A clear drops what is queued and tells the door (`cleared`). Its ticks start with a
reply's first frame (`on_demand`), and stop while nothing plays. A reply's first audio is when
its first frame was written to the socket (the door calls `on_first_audio` then): a loop
busy between the tick and the write delays what the caller hears. `Captions`: the reply's
words to the door as the session releases them, in step with that audio.
"""

from __future__ import annotations

from collections.abc import Callable

from livekit.agents.voice import io

from ..audio_io import PacedOutput

# (pcm of one tick, whether it is the reply's first): the door's wire takes it from here
SendAudio = Callable[[bytes, bool], None]


class SocketSpeaker(PacedOutput):
    """See the module."""

    on_demand = True  # the client plays as it receives: no grid to wait for

    def __init__(self, send: SendAudio, cleared: Callable[[], None], *, sample_rate: int,
                 frame_ms: int) -> None:
        super().__init__("SocketSpeaker", sample_rate=sample_rate, frame_ms=frame_ms,
                         on_first_audio=self._first_tick)
        self._send = send
        self._on_cleared = cleared
        self._first = False
        self._last_audible = float("-inf")

    def _first_tick(self, at: float) -> None:
        self._first = True

    def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
        if audible:
            first, self._first = self._first, False
            self._send(chunk.ljust(self.frame_samples * 2, b"\0"), first)
            self._last_audible = at

    def _cleared(self, at: float) -> None:
        self._on_cleared()

    @property
    def played_s(self) -> float:
        """The current (or last) reply's audio sent so far, seconds."""
        return self._played_s

    def silent_from(self, t: float) -> float:
        """When the client stopped being sent audio, for a barge-in decided at `t`."""
        if self._last_audible < t - self._frame_s:
            return t
        return max(t, self._last_audible + self._frame_s)


class Captions(io.TextOutput):
    """A reply's words to the door's `on_text` as the session releases them (in step with
    its audio); the door's own events end them."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        super().__init__(label="captions", next_in_chain=None)
        self._on_text = on_text

    async def capture_text(self, text: str) -> None:
        if text:
            self._on_text(text)

    def flush(self) -> None:
        pass
