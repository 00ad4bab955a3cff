"""A conversation's user turns as a door that reports them sees them (`UserTurns`): the
client's audio, placed on its own clock (ms appended), and each turn as an item of the
door's (`items.py`) with its transcript to follow.

The conversation hears the audio (a turn detection set): its policy ends the turn. Speech
over a reply is said only once the duplex controller knows it is a turn (a backchannel or
a cough is none). Otherwise the client owns its turns: the audio waits in a bounded
buffer until the client commits it (transcribed here) or clears it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from livekit import rtc
from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, llm
from livekit.agents.llm import StopResponse
from livekit.agents.voice.events import UserStateChangedEvent

from ..duplex import DuplexState
from ..speech_end import SpeechEnd
from .items import Item, Items, new_id
from .mic import MicFramer
from .options import ConversationError

if TYPE_CHECKING:
    from .core import Conversation

log = logging.getLogger("voice_agent.conversation")

MIN_COMMIT_MS = 100  # a commit of less audio is an error, as the Realtime API's
MAX_BUFFER_S = 120.0  # uncommitted input audio kept (older is dropped, with an error)


class TurnEvents(Protocol):
    """What a door hears of its user's turns (`UserTurns`)."""
    def speech_started(self, item_id: str, start_ms: int) -> None: ...
    def speech_stopped(self, item_id: str, end_ms: int) -> None: ...
    def committed(self, item: Item, previous: str | None) -> None: ...
    def transcribed(self, item: Item, seconds: float, heard: str | Exception) -> None: ...


class UserTurns:
    """See the module. `conv`'s `on_user_turn` is `user_turn`;
    `synced`: the agent's context made from the items again."""

    def __init__(self, conv: Conversation, items: Items, events: TurnEvents,
                 synced: Callable[[], Awaitable[None]]) -> None:
        self.conv, self.items, self.events, self._synced = conv, items, events, synced
        self._buffer: list[rtc.AudioFrame] = []  # 16 kHz for the ear, since the commit
        self._buffer_ms = 0.0
        self.appended_ms = 0.0  # audio appended since the last commit, as the client counts
        self._framer: MicFramer | None = None  # the buffer's (the mic's is MicInput's)
        # (perf time, audio ms so far): the recent appends, to place the VAD's moments
        self._received: deque[tuple[float, float]] = deque(maxlen=256)
        self.speech_item: str | None = None  # the user item the conversation is hearing
        self._held: tuple[str, int] | None = None  # speech over a reply, not yet a turn
        self._transcribing: set[asyncio.Task[Any]] = set()
        conv.duplex.on_state(self._on_duplex)
        conv.pipeline.session.on("user_state_changed", self._on_user_state)

    @property
    def hearing(self) -> bool:
        return self.conv.options.turn_detection is not None

    def push(self, pcm: np.ndarray, rate: int) -> None:
        """One append of int16 audio at `rate`."""
        ms = len(pcm) / rate * 1000
        self.appended_ms += ms
        self._received.append((time.perf_counter(),
                               (self._received[-1][1] if self._received else 0.0) + ms))
        if self.hearing:  # the conversation hears it
            mic = self.conv.mic
            if mic.input_rate != rate:  # the input format changed
                mic.mic, mic.input_rate = MicFramer(rate), rate
            mic.push(pcm.tobytes())
            return
        if self._framer is None or self._framer.input_rate != rate:
            self._framer = MicFramer(rate)
        for f in self._framer.push(pcm.tobytes()):
            self._buffer.append(f)
            self._buffer_ms += f.duration * 1000
        dropped = 0.0
        while self._buffer_ms > MAX_BUFFER_S * 1000:
            d = self._buffer.pop(0).duration * 1000
            self._buffer_ms -= d
            dropped += d
        if dropped:
            raise ConversationError("input_audio_buffer_full", f"over {MAX_BUFFER_S:.0f} s of "
                                    f"uncommitted audio: the oldest {dropped:.0f} ms were "
                                    "dropped (commit or clear the buffer)")

    def commit(self) -> None:
        """The client ends its turn: the conversation's (heard), or the buffer's as an
        item, transcribed."""
        # Counted as appended: the resampler and the 20 ms framer hold the last few ms
        # back (100 ms appended once read as 60), so the framer's rest is taken here too.
        if self.appended_ms < MIN_COMMIT_MS - 0.5:
            raise ConversationError("input_audio_buffer_commit_empty", "buffer too small: "
                                    f"expected at least {MIN_COMMIT_MS} ms of audio, have "
                                    f"{self.appended_ms:.0f} ms")
        td = self.conv.options.turn_detection
        if td is not None:
            self.appended_ms = 0.0
            self.conv.pipeline.session.commit_user_turn(skip_reply=not td.create_response)
            return
        frames = self._buffer + (self._framer.flush() if self._framer else [])
        self.clear()
        now = time.perf_counter()  # the client ended the turn: its commit is the end
        self.conv.tracker.user_turn_ended(SpeechEnd(at=now, decided=now, silence_s=0.0))
        self.conv.tracker.turn_decided(now)
        self.transcribe(self._item(new_id("item")), frames)

    def clear(self) -> None:
        if self.hearing:
            self.conv.pipeline.session.clear_user_turn()
            self.speech_item = None
        if self._framer is not None:
            self._framer.flush()
        self._buffer, self._buffer_ms, self.appended_ms = [], 0.0, 0.0

    def _ms_at(self, t: float) -> float:
        """The input audio's position (ms appended) when perf time `t` was."""
        at = 0.0
        for when, ms in self._received:
            if when > t:
                break
            at = ms
        return at

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        td = self.conv.options.turn_detection
        if ev.new_state != "speaking" or td is None or self.speech_item is not None:
            return  # speech resumed within a turn still open: the same item
        self.speech_item = new_id("item")
        now_ms = self._received[-1][1] if self._received else 0.0
        # the VAD says so after its minimum speech
        start = now_ms - self.conv.settings.vad_min_speech_ms - td.prefix_padding_ms
        self._held = (self.speech_item, int(max(0.0, start)))
        if self.conv.duplex.state != DuplexState.PAUSED:  # not over a reply
            self._say_started()

    def _on_duplex(self, state: DuplexState) -> None:
        if self._held is None:
            return
        if state == DuplexState.INTERRUPTING:  # words: the speech cuts the reply
            self._say_started()
        elif state == DuplexState.SPEAKING:  # a backchannel or a noise: the reply goes on
            self._held, self.speech_item = None, None

    def _say_started(self) -> None:
        if self._held is not None:
            (item_id, start_ms), self._held = self._held, None
            self.events.speech_started(item_id, start_ms)

    async def user_turn(self, msg: llm.ChatMessage) -> None:
        """The conversation ended a user turn: it is the item its speech started, with its
        transcript; answered unless create_response is off."""
        self._say_started()  # if it was held
        item_id, self.speech_item = self.speech_item or new_id("item"), None
        msg.id = item_id
        end = self.conv.tracker.speech_end  # the VAD's latest located end (speech_end.py)
        end_ms = self._ms_at(end.at) if end is not None else self.appended_ms
        self.events.speech_stopped(item_id, int(end_ms))
        item = self._item(item_id)
        seconds, self.appended_ms = self.appended_ms / 1000, 0.0
        self.conv.when_heard(msg.text_content or "",
                             lambda words: self._heard(item, seconds, words))
        td = self.conv.options.turn_detection
        if td is None or not td.create_response:
            await self._synced()  # the item is in the context, unanswered
            raise StopResponse()

    def _heard(self, item: Item, seconds: float, heard: str | Exception) -> None:
        if not isinstance(heard, Exception):
            item["content"][0]["transcript"] = heard
        self.events.transcribed(item, seconds, heard)

    def _item(self, item_id: str) -> Item:
        """The user's audio as an item (its transcript follows)."""
        item: Item = {"id": item_id, "type": "message", "role": "user", "status": "completed",
                      "content": [{"type": "input_audio", "transcript": None}]}
        self.events.committed(item, self.items.append(item))
        return item

    def transcribe(self, item: Item, frames: list[rtc.AudioFrame]) -> None:
        """The item's transcript, in the background (a reply waits for it: `transcribed`)."""
        async def run() -> None:
            try:
                ev = await self.conv.pipeline.stt.transcribe(frames, None, NOT_GIVEN,
                                                             DEFAULT_API_CONNECT_OPTIONS)
                heard: str | Exception = ev.alternatives[0].text if ev.alternatives else ""
            except Exception as e:  # the ear failed: the item stays, untranscribed
                log.warning("transcription failed: %s", e)
                heard = e
            self._heard(item, sum(f.duration for f in frames), heard)
            await self._synced()

        task = self.conv.spawn(run())
        self._transcribing.add(task)
        task.add_done_callback(self._transcribing.discard)

    async def all_transcribed(self) -> None:
        """A reply answers what was said, transcripts included."""
        if self._transcribing:
            await asyncio.gather(*list(self._transcribing), return_exceptions=True)
