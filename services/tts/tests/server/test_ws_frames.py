"""`ws_speech.FrameBatch`, the WebSocket's audio frames written a loop turn at a time:
RFC 6455 framing at each length class, one transport write per turn, what was gathered
goes first when something else is sent, a closing socket is a ConnectionError, and a
full send buffer holds the sender until it drains. The transport is a stand-in (the
end-to-end WebSocket tests are test_ws_speech.py and test_ws_browser.py)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from voice_tts.server.fronts.ws_speech import SEND_BUFFER_BYTES, FrameBatch


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered


def unframe(data: bytes) -> list[bytes]:
    """Server frames (unmasked) back into payloads; each must be FIN + binary."""
    out, i = [], 0
    while i < len(data):
        first, second = data[i], data[i + 1]
        assert first == 0x82 and not second & 0x80, (first, second)
        n, i = second & 0x7F, i + 2
        if n == 126:
            (n,), i = struct.unpack("!H", data[i:i + 2]), i + 2
        elif n == 127:
            (n,), i = struct.unpack("!Q", data[i:i + 8]), i + 8
        out.append(data[i:i + n])
        i += n
    return out


async def test_frames_of_one_turn_go_in_one_write_each_length_class() -> None:
    t = Transport()
    batch = FrameBatch(t)  # type: ignore[arg-type]
    payloads = [b"", b"a" * 125, b"b" * 126, b"c" * 960, b"d" * 65535, b"e" * 65536]
    for p in payloads:
        await batch.send(p)
    assert t.writes == []  # nothing until the turn ends
    await asyncio.sleep(0)
    assert len(t.writes) == 1 and unframe(t.writes[0]) == payloads
    await batch.send(b"next turn")
    await asyncio.sleep(0)
    assert len(t.writes) == 2 and unframe(t.writes[1]) == [b"next turn"]


async def test_flush_sends_what_was_gathered_before_anything_else() -> None:
    t = Transport()
    batch = FrameBatch(t)  # type: ignore[arg-type]
    await batch.send(b"frame")
    batch.flush()  # an event is next
    t.write(b"event")
    await asyncio.sleep(0)  # the turn's own flush finds nothing left
    assert unframe(t.writes[0]) == [b"frame"] and t.writes[1:] == [b"event"]


async def test_a_closing_socket_is_a_connection_error() -> None:
    t = Transport()
    t.closing = True
    with pytest.raises(ConnectionError):
        await FrameBatch(t).send(b"frame")  # type: ignore[arg-type]


async def test_a_full_send_buffer_holds_the_sender_until_it_drains() -> None:
    t = Transport()
    batch = FrameBatch(t)  # type: ignore[arg-type]
    t.buffered = SEND_BUFFER_BYTES + 1  # the client reads nothing
    sender = asyncio.create_task(batch.send(b"frame"))
    await asyncio.sleep(0.05)
    assert not sender.done() and unframe(t.writes[0]) == [b"frame"]  # written, waiting
    t.buffered = 0
    await asyncio.wait_for(sender, 1)
