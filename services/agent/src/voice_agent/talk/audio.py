"""The conversation's audio on its socket: the client's mic in (`SocketInput`: the shared
MicInput, in real time), the reply out (`socket_output`: the shared paced SocketSpeaker,
binary frames, barge-in clears) through the conversation's ordered sender (`TalkOutbox`:
conversation/outbox.py).

Knows the protocol only as far as sending its events; nothing of admission, voices or
the pipeline's turns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from livekit import rtc
from livekit.agents.voice import io

from ..conversation.mic import MicInput
from ..conversation.outbox import Outbox
from ..conversation.speaker import SocketSpeaker
from .protocol import ProtocolError, Server, server_message

MAX_AHEAD_S = 5.0  # mic audio a client may send ahead of real time (else: too_fast)
MAX_OUTBOX_S = 10.0  # reply audio waiting for a client that reads too slowly


class TalkOutbox(Outbox):
    """The conversation's outbox (conversation/outbox.py) in this protocol's words."""

    def __init__(self, ws: web.WebSocketResponse, frame_s: float, name: str) -> None:
        # bounded by MAX_OUTBOX_S of reply frames (events are few beside them)
        super().__init__(ws.send_str, ws.send_bytes, max_items=int(MAX_OUTBOX_S / frame_s),
                         name=name)

    def event(self, type_: Server, **fields: object) -> None:
        self.text(server_message(type_, **fields))


class SocketInput(MicInput):
    """The client's mic (conversation/mic.py `MicInput`), in real time: a client that
    sends audio faster than that (more than MAX_AHEAD_S ahead of the clock since its
    first message) is refused, `too_fast` (a conversation falling behind reading is
    MicInput's other limit: the call goes on)."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        super().__init__(input_rate, frame_ms)
        self._t0: float | None = None  # monotonic time of the first audio

    def push(self, pcm: bytes) -> list[rtc.AudioFrame]:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if self.mic.received_s + len(pcm) / 2 / self.input_rate - (now - self._t0) \
                > MAX_AHEAD_S:
            raise ProtocolError("too_fast", "mic audio arrives faster than real time "
                                f"(over {MAX_AHEAD_S:.0f} s ahead of the clock)")
        return super().push(pcm)


def socket_output(outbox: TalkOutbox, *, sample_rate: int, frame_ms: int,
                  on_first_audio: Callable[[float], None]) -> SocketSpeaker:
    """The client's loudspeaker (conversation/speaker.py): each tick a binary frame, the
    first one's write the reply's first audio; a clear drops the frames not yet sent and
    tells the client to flush its playout buffer (`clear`)."""
    def send(chunk: bytes, first: bool) -> None:
        outbox.binary(chunk, on_first_audio if first else None)

    def cleared() -> None:
        outbox.drop_audio()
        outbox.event(Server.CLEAR)

    return SocketSpeaker(send, cleared, sample_rate=sample_rate, frame_ms=frame_ms)


class SocketCaptions(io.TextOutput):
    """The reply's words as `caption` deltas, in step with its audio: the session's
    TranscriptSynchronizer releases them as the paced audio plays (after a barge-in it
    releases none of that reply's)."""

    def __init__(self, outbox: TalkOutbox) -> None:
        super().__init__(label="talk-captions", next_in_chain=None)
        self._outbox = outbox

    async def capture_text(self, text: str) -> None:
        if text:
            self._outbox.event(Server.CAPTION, delta=text)

    def flush(self) -> None:
        pass  # the reply's transcript event ends it
