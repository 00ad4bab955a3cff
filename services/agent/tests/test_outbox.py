"""The one outbox of every door (conversation/outbox.py): in order, audio dropped on a
barge-in, and a client that stops reading ends its conversation (its slot is freed) by
either limit: too much queued, or one send blocked past SEND_DEADLINE_S. The second is
the one a mic that streams on while nothing is read used to escape: aiohttp's heartbeat
is reset by every message received."""

from __future__ import annotations

import asyncio

import pytest
from voice_agent.conversation import outbox as outbox_module
from voice_agent.conversation.outbox import Outbox


class Client:
    def __init__(self, reads: bool = True) -> None:
        self.got: list[str | bytes] = []
        self.reads = reads

    async def send(self, message: str | bytes) -> None:
        if not self.reads:
            await asyncio.Event().wait()  # its buffers are full: the write never ends
        self.got.append(message)


async def test_in_order_audio_dropped_and_drained_on_close() -> None:
    c = Client()
    box = Outbox(c.send, c.send, max_items=100)
    sent: list[float] = []
    box.text("a")
    box.binary(b"1", on_sent=sent.append)
    box.binary(b"delta")
    box.drop_audio()  # a barge-in: unsent audio is never heard
    box.binary(b"2")
    box.text("b")
    box.close()
    await asyncio.wait_for(box.run(), 5)
    assert c.got == ["a", b"2", "b"] and not sent and box.audio_sent == 1
    box.text("after")  # closed: nothing more is taken
    assert box.pending() == []


async def test_a_client_that_takes_nothing_ends_after_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_module, "SEND_DEADLINE_S", 0.3)
    box = Outbox(Client(reads=False).send, max_items=100)
    box.text("x")
    run = asyncio.create_task(box.run())
    await asyncio.sleep(0.1)
    assert not run.done() and not box.stalled  # a slow write is not yet a stalled client
    await asyncio.wait_for(run, 2)
    assert box.stalled
    box.text("y")
    assert box.pending() == []


async def test_too_much_queued_ends_it() -> None:
    box = Outbox(Client(reads=False).send, max_items=3)
    for i in range(3):
        box.text(str(i))
    assert not box.stalled
    box.text("one too many")
    assert box.stalled and box.pending() == ["0", "1", "2"]
    await asyncio.wait_for(box.run(), 1)  # returns at once: the session ends
