"""Sessions: the streaming API one client (one gRPC call) talks to.

A session owns one engine slot (its row of the device state), a seed for its sampling
noise and a queue of utterances. Text pushed after `flush()` opens the next utterance; the
engine works on the head of the queue. Client threads only touch the text side (under
`_lock`); the engine thread owns the generation state of each `Utterance`.

Cancel guarantee: the engine thread calls the sink while holding `_emit_lock` and checks
the utterance's `cancelled` flag under it; `cancel()` sets the flag under the same lock.
So once `cancel()` returns, no packet of the cancelled utterance can reach the sink (a
sink that blocks delays `cancel()` by that long: keep sinks quick).

Ended before its flush: an utterance that the frame cap (truncation) or the model (codec
EOS) ends while its text is still streaming stays the session's current utterance: text
pushed into it is dropped until `flush()` (or cancel / reset) closes it. So the cap bounds
what one flush-delimited utterance says, and utterance ids stay one per flush (the
contract's): text after an early EOS opened a new utterance, whose FLUSHED a client
waiting for the first one's never got (two calls hung so in an H100 open loop with text
streamed a word at a time, bench/results/2026-11-28-gpu-bound).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .api import SessionParams
from .text import TextStream, TextTokenizer
from .voices import ResolvedVoice

Sink = Callable[[Any], None]


@dataclass
class Utterance:
    id: int
    stream: TextStream
    created: float = field(default_factory=time.perf_counter)
    first_text: float | None = None
    cancelled: bool = False
    # --- engine-thread state ---
    running: bool = False
    prompt_len: int = 0
    steps: int = 0  # decode steps (the first: frame 0, no talker) == frames made
    ending: str | None = None  # why it ends ("eos", "max_frames") once its last audio is out
    ended: bool = False  # its UtteranceEnd is out
    # decoded frames not yet sent: (codes (16,), pcm (frame_samples,), its s16) each
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    emitted: int = 0  # frames sent as audio
    timings: dict[str, float] = field(default_factory=dict)
    last_active: float = 0.0


class Session:
    """`wake()` tells the engine there is work (text, a flush, a cancel); `release(self)`
    gives the slot back on close. Both come from the engine, which this module does not
    know."""

    def __init__(self, session_id: int, slot: int, params: SessionParams,
                 voice: ResolvedVoice, instruct_ids: list[int] | None, sink: Sink,
                 tokenizer: TextTokenizer, wake: Callable[[], None],
                 release: Callable[[Session], None]) -> None:
        self.id, self.slot, self.params = session_id, slot, params
        self.voice, self.instruct_ids, self.sink = voice, instruct_ids, sink
        self._tokenizer = tokenizer
        self._wake, self._release = wake, release
        self._lock = threading.Lock()
        self._emit_lock = threading.RLock()
        self._utts: deque[Utterance] = deque()
        self._dropped: list[Utterance] = []  # cancelled, UtteranceEnd still to send
        self._open_ended: Utterance | None = None  # ended before its flush, not closed yet
        self._next_utt = 0
        self.closed = False
        self.paused = False
        self.seed = params.seed if params.seed is not None else int.from_bytes(
            os.urandom(4), "little")
        self._epoch = 0  # utterances prefilled since the seed was set

    # --- client side (any thread) ---------------------------------------------------------

    def push_text(self, piece: str | bytes) -> None:
        if not isinstance(piece, str | bytes | bytearray | memoryview):
            raise ValueError(f"text piece must be str or bytes, got {type(piece).__name__}")
        if not piece:
            return
        with self._lock:
            self._check_open()
            if self._open_ended is not None:
                return  # the rest of an utterance ended before its flush: dropped
            utt = self._utts[-1] if self._utts and not self._utts[-1].stream.finished else None
            if utt is None:
                stream = TextStream(self._tokenizer, self.params.max_text_chars)
                stream.push(piece)  # validate before opening a new utterance
                utt = Utterance(self._next_utt, stream)
                self._next_utt += 1
                self._utts.append(utt)
            else:
                utt.stream.push(piece)
            if utt.first_text is None:
                utt.first_text = time.perf_counter()
        self._wake()

    def flush(self) -> None:
        """End the current utterance: speak everything pushed so far to its end."""
        with self._lock:
            self._check_open()
            if self._open_ended is not None:
                self._open_ended.stream.finish()
                self._open_ended = None
            elif self._utts and not self._utts[-1].stream.finished:
                self._utts[-1].stream.finish()
        self._wake()

    def cancel(self) -> None:
        """Barge-in: drop pending text and in-flight work now. No packet of a dropped
        utterance reaches the sink after this returns."""
        with self._emit_lock, self._lock:
            self._drop_all()
        self._wake()

    def reset(self, seed: int | None = None) -> None:
        """cancel() plus the random stream from its start (the session's seed, or `seed`)."""
        with self._emit_lock, self._lock:
            self._drop_all()
            if seed is not None:
                self.seed = seed
            self._epoch = 0
        self._wake()

    def pause(self) -> None:
        """Flow control: the engine skips this session until `resume()`."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake()

    def close(self) -> None:
        with self._emit_lock, self._lock:
            if self.closed:
                return
            self._drop_all()
            self.closed = True
        self._release(self)

    @property
    def utterance_id(self) -> int:
        """Id of the utterance that the next pushed text belongs to (or is speaking)."""
        with self._lock:
            if self._open_ended is not None:
                return self._open_ended.id
            if self._utts and not self._utts[-1].stream.finished:
                return self._utts[-1].id
            return self._next_utt

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("session is closed")

    def _drop_all(self) -> None:
        for utt in self._utts:
            utt.cancelled = True
            if utt.stream.chars or utt.running:
                self._dropped.append(utt)
        self._utts.clear()
        self._open_ended = None  # already ended (its UtteranceEnd is out): nothing to send

    # --- engine side ----------------------------------------------------------------------

    def next_seed(self) -> int:
        """The noise seed of the next utterance: a hash of (session seed, utterance number
        since the seed was set), so utterances differ and `reset()` replays them."""
        with self._lock:
            epoch, self._epoch = self._epoch, self._epoch + 1
        return (self.seed * 0x9E3779B1 + epoch * 0x85EBCA6B) & 0x7FFFFFFF

    def head(self) -> Utterance | None:
        with self._lock:
            return self._utts[0] if self._utts else None

    def take_dropped(self) -> list[Utterance]:
        with self._lock:
            dropped, self._dropped = self._dropped, []
            return dropped

    def finish_head(self, utt: Utterance, keep_open: bool = False) -> None:
        """`utt` has ended; `keep_open`: by the frame cap or codec EOS, so text not yet
        flushed stays with it (dropped) until the flush."""
        with self._lock:
            if self._utts and self._utts[0] is utt:
                self._utts.popleft()
            if keep_open and not utt.stream.finished:
                self._open_ended = utt

    def emit(self, utt: Utterance, event: Any, always: bool = False) -> bool:
        """Deliver `event` unless `utt` was cancelled (or `always`). Engine thread only."""
        with self._emit_lock:
            if utt.cancelled and not always:
                return False
            self.sink(event)
            return True
