"""What goes to one client, in order, sent by one task (`Outbox`): every door's events and
reply audio (`/v1/talk`'s JSON and PCM frames, `/v1/realtime`'s JSON events).

A client that stops reading must not hold its conversation (and its slot) forever, and
waiting for it must not grow memory without bound. Two limits end it:
- `max_items` queued and not yet sent (a client that reads slower than we make);
- one send that takes over SEND_DEADLINE_S: the client's socket buffers are full and it
  takes nothing. aiohttp's heartbeat does not catch this while the client still sends
  (a mic streams on), since every message it receives resets the heartbeat.
Either sets `stalled`, and `run` returns: the door ends the conversation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("voice_agent.outbox")

SEND_DEADLINE_S = 10.0  # one send blocked this long: the client stopped reading

OnSent = Callable[[float], None]


class Outbox:
    """One client's ordered sender (see the module). Text messages (events) and binary
    ones (reply audio, dropped by `drop_audio()`: a barge-in, what is not sent yet is not
    heard). A binary message may carry a call made with the moment it was written (a
    reply's first frame: its latency)."""

    def __init__(self, send_text: Callable[[str], Awaitable[object]],
                 send_bytes: Callable[[bytes], Awaitable[object]] | None = None, *,
                 max_items: int, name: str = "") -> None:
        self._send_text = send_text
        self._send_bytes = send_bytes
        self._items: deque[tuple[str | bytes, bool, OnSent | None]] = deque()
        self._ready = asyncio.Event()
        self.max_items = max_items
        self.name = name  # for its log line
        self.audio_sent = 0  # binary (audio) messages written
        self.stalled = False  # the client stopped reading: nothing more is queued or sent
        self.closed = False

    def text(self, message: str) -> None:
        self._put(message, False, None)

    def binary(self, message: bytes, on_sent: OnSent | None = None) -> None:
        """A binary message: reply audio (dropped by `drop_audio`)."""
        self._put(message, True, on_sent)

    def _put(self, message: str | bytes, audio: bool, on_sent: OnSent | None) -> None:
        if self.stalled or self.closed:
            return
        if len(self._items) >= self.max_items:
            self._stall(f"{self.max_items} messages wait unsent")
            return
        self._items.append((message, audio, on_sent))
        self._ready.set()

    def drop_audio(self) -> None:
        self._items = deque(x for x in self._items if not x[1])

    def pending(self) -> list[str | bytes]:
        """What waits unsent, in order."""
        return [x[0] for x in self._items]

    def take(self) -> list[str | bytes]:
        """What waits unsent, taken out (a caller that sends it itself)."""
        out = self.pending()
        self._items.clear()
        return out

    def close(self) -> None:
        """Nothing more is queued; `run` sends what waits, then returns."""
        self.closed = True
        self._ready.set()

    def _stall(self, why: str) -> None:
        if not self.stalled:
            self.stalled = True
            log.warning("%s: the client stopped reading (%s): ending its conversation",
                        self.name or "a client", why)
        self._ready.set()

    async def run(self) -> None:
        """Send until closed and drained, stalled, or the client is gone."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._items:
                if self.stalled:
                    return
                message, audio, on_sent = self._items.popleft()
                send = self._send_text if isinstance(message, str) else self._send_bytes
                assert send is not None, "a binary message on a text-only outbox"
                try:
                    async with asyncio.timeout(SEND_DEADLINE_S):
                        await send(message)  # type: ignore[arg-type]
                except TimeoutError:
                    self._stall(f"one send blocked {SEND_DEADLINE_S:.0f} s")
                    return
                except (ConnectionError, RuntimeError):
                    return  # the client is gone
                if audio:
                    self.audio_sent += 1
                if on_sent is not None:
                    on_sent(time.perf_counter())
            if self.stalled or self.closed:
                return

