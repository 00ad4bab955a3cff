"""A conversation's replies as a door that reports each one follows them (`Replies`):
a reply from when it is scheduled (one started before the user's turn ended is dropped
unseen if they go on) to its end, with what it said as items (its message, opened at its
first words or audio; its function calls; the agent's own tools' outputs), a slow tool's
filler speech counted as its own, and how it ended: completed, cancelled (a turn cut it,
or the client), incomplete (its token limit came before a word) or failed. A reply the
door asks for (`ask`) may carry its own modalities, token limit and tools; the
conversation's come back at its end.

The door hears of it through `ReplyEvents` and maps that onto its wire.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from livekit.agents import llm
from livekit.agents.voice import SpeechHandle
from livekit.agents.voice.events import (
    ConversationItemAddedEvent,
    ErrorEvent,
    FunctionToolsExecutedEvent,
    SpeechCreatedEvent,
)

from .items import Item, Items, Said, heard_text, new_id
from .options import invalid, llm_tool_choice

if TYPE_CHECKING:
    from .core import Conversation

log = logging.getLogger("voice_agent.conversation")


@dataclass
class Reply:
    id: str
    handle: SpeechHandle
    modalities: tuple[str, ...]  # ("audio",), or ("text",): words only
    voice: str
    max_tokens: int | None
    metadata: dict[str, Any] | None = None  # the door's, echoed
    output: list[Item] = field(default_factory=list)  # its items, in order
    msg: Item | None = None  # the message being said
    said: Said | None = None  # what it said so far (`Items.said`'s)
    # speech said within it (a slow tool's filler): its messages are the reply's too
    inner: list[SpeechHandle] = field(default_factory=list)
    msg_of: SpeechHandle | None = None  # whose message `msg` is
    status: str = "in_progress"  # completed, cancelled, incomplete, failed
    reason: str = "turn_detected"  # why it was cancelled, unless the client cancels it
    error: str | None = None  # the part that failed it
    own_tools: bool = False  # asked with its own tools: the conversation's come back
    audio_ms: float = 0.0  # sent
    usage: llm.CompletionUsage | None = None

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities

    @property
    def cut(self) -> bool:
        """A user's turn cut it: its message keeps what was heard."""
        return self.status == "cancelled" and self.reason == "turn_detected"

    def index(self, item: Item) -> int:
        return next(i for i, o in enumerate(self.output) if o is item)


class ReplyEvents(Protocol):
    """What a door hears of its replies (`Replies`)."""
    def reply_started(self, r: Reply) -> None: ...
    def message_opened(self, r: Reply, msg: Item, previous: str | None) -> None: ...
    def reply_text(self, r: Reply, msg: Item, text: str) -> None: ...
    def reply_audio(self, r: Reply, msg: Item, pcm: bytes) -> None: ...
    def function_called(self, r: Reply, call: Item, previous: str | None) -> None: ...
    def tool_output(self, item: Item, previous: str | None) -> None: ...
    def message_closed(self, r: Reply, msg: Item) -> None: ...
    def reply_done(self, r: Reply) -> None: ...


class Replies:
    """The replies of one conversation (see the module). `items`: the door's items, the
    replies' own added; `sample_rate`: the reply audio's."""

    def __init__(self, conv: Conversation, items: Items, events: ReplyEvents,
                 sample_rate: int) -> None:
        self.conv = conv
        self.items = items
        self.events = events
        self.rate = sample_rate
        self.current: Reply | None = None  # the reply under way, announced
        self._asked: dict[str, Any] | None = None  # `ask`'s options, while it asks
        self.tool_names = {t.id for t in conv.own_tools}  # the agent's own (run here)
        for name, fn in (("speech_created", self._on_speech), ("error", self._on_error),
                         ("conversation_item_added", self._on_item),
                         ("function_tools_executed", self._on_tools)):
            conv.pipeline.session.on(name, fn)

    async def ask(self, chat_ctx: llm.ChatContext, modalities: tuple[str, ...],
                  max_tokens: int | None, tools: list[dict[str, Any]] | None,
                  tool_choice: str | dict[str, Any], metadata: dict[str, Any] | None) -> None:
        """A reply to `chat_ctx` the door asks for, with its own modalities, token limit
        and (not None) client tools; the conversation's come back at its end."""
        self.conv.set_reply(modalities, max_tokens)
        if tools is not None:
            await self.conv.set_tools(tools)
        some = (self.conv.options.tools if tools is None else tools) or self.conv.own_tools
        self._asked = {"modalities": modalities, "max_tokens": max_tokens,
                       "metadata": metadata, "own_tools": tools is not None}
        try:
            self.conv.pipeline.session.generate_reply(
                chat_ctx=chat_ctx, tool_choice=llm_tool_choice(tool_choice) if some else "none")
        finally:
            self._asked = None

    def truncate(self, item: Item, end_ms: Any) -> None:
        """The client heard `end_ms` of a reply's message: its transcript keeps what that
        spoke (the reply is cancelled if it is still saying it)."""
        said = self.items.said.get(item["id"])
        if item.get("role") != "assistant" or said is None or said.audio_ms is None:
            raise invalid("only an assistant message with audio can be truncated", "item_id")
        audio_ms = said.audio_ms
        if isinstance(end_ms, bool) or not isinstance(end_ms, int) or not 0 <= end_ms <= audio_ms:
            raise invalid(f"audio_end_ms must be 0..{audio_ms:.0f} (the item's audio)",
                          "audio_end_ms")
        if self.current is not None and self.current.msg is item:
            self.cancel("client_cancelled")
        item["content"][0]["transcript"] = heard_text(said.text, end_ms, audio_ms, True)
        said.audio_ms = min(audio_ms, end_ms)

    def cancel(self, reason: str) -> None:
        r = self.current
        if r is not None and not r.handle.done():
            r.reason = reason
            r.handle.interrupt(force=True)

    def _on_speech(self, ev: SpeechCreatedEvent) -> None:
        asked = self._asked or {}
        opts = self.conv.options
        if ev.source == "say" and self._asked is None and self.current is not None:
            self.current.inner.append(ev.speech_handle)  # a tool's filler, said meanwhile
            return
        r = Reply(id=new_id("resp"), handle=ev.speech_handle,
                  modalities=asked.get("modalities", opts.modalities), voice=opts.voice,
                  max_tokens=asked.get("max_tokens", opts.max_output_tokens),
                  metadata=asked.get("metadata"), own_tools=asked.get("own_tools", False))
        if self._asked is not None:  # the door's: it is the reply from now
            self._announce(r)
        self.conv.spawn(self._follow(r))

    def _announce(self, r: Reply) -> None:
        if self.current is r:
            return
        if self.current is not None:  # its done callback has not run yet
            self._done(self.current)
        self.current = r
        self.events.reply_started(r)

    async def _follow(self, r: Reply) -> None:
        h = r.handle
        scheduled = asyncio.ensure_future(h._wait_for_scheduled())
        done = asyncio.ensure_future(_until_done(h))
        try:
            await asyncio.wait([scheduled, done], return_when=asyncio.FIRST_COMPLETED)
            if not h.scheduled:
                return  # never said: the user went on
            self._announce(r)
            await done
            while inner := [h for h in r.inner if not h.done()]:  # a filler still playing
                await _until_done(inner[0])
        finally:
            scheduled.cancel()
            done.cancel()
        cur = self.current
        if cur is not None and cur.handle is r.handle:  # r, or the reply it went on to
            self._done(cur)

    def _now(self) -> Reply | None:
        """The reply whose words or audio come now."""
        speech = self.conv.pipeline.session.current_speech
        r = self.current
        if r is not None and (speech is None or r.handle is speech or speech in r.inner):
            return r
        return None

    def _message(self, r: Reply) -> tuple[Item, Said]:
        """The reply's message, opened at its first words or audio (one a speech), and
        what it said so far."""
        speech = self.conv.pipeline.session.current_speech
        if r.msg is not None and speech is not None and r.msg_of is not speech:
            self._close(r, "completed")  # the filler's, said
            r.msg = r.said = None
        if r.msg is None:
            r.msg_of = speech
            part = ({"type": "output_audio", "transcript": ""} if r.audio
                    else {"type": "output_text", "text": ""})
            msg: Item = {"id": new_id("item"), "type": "message", "role": "assistant",
                         "status": "in_progress", "content": [part]}
            r.said = self.items.said[msg["id"]] = Said(audio_ms=0.0 if r.audio else None)
            prev = self.items.append(msg)
            r.output.append(msg)
            r.msg = msg
            self.events.message_opened(r, msg, prev)
        assert r.said is not None
        return r.msg, r.said

    def text(self, text: str) -> None:
        """The reply's words: an audio reply's as its audio plays, a text reply's as the
        thinker writes them."""
        if (r := self._now()) is not None:
            msg, said = self._message(r)
            said.text += text
            self.events.reply_text(r, msg, text)

    def audio(self, pcm: bytes, first: bool) -> None:
        """One paced tick of the reply's audio, as it leaves (core's speaker)."""
        if (r := self._now()) is not None:
            msg, said = self._message(r)
            if first:
                self.conv.tracker.audio_published()  # the turn's first audio left
            r.audio_ms += len(pcm) / (2 * self.rate) * 1000
            said.audio_ms = r.audio_ms
            self.events.reply_audio(r, msg, pcm)

    def _on_item(self, ev: ConversationItemAddedEvent) -> None:
        """The session's own record of a reply: its id becomes the message's, its text
        what was said (all of it, or what was heard before a cut)."""
        item, r = ev.item, self.current
        if (getattr(item, "role", None) == "assistant" and r is not None and r.msg is not None
                and r.said is not None):
            item.id = r.msg["id"]
            r.said.heard = item.text_content or ""

    def _on_tools(self, ev: FunctionToolsExecutedEvent) -> None:
        """The reply's calls: each a function_call item of the reply; the agent's own
        tools' results items of the conversation (their follow-up is the next reply)."""
        r = self._now() or self.current
        if r is None:
            return
        ran = False
        for call, out in zip(ev.function_calls, ev.function_call_outputs, strict=False):
            item: Item = {"id": new_id("item"), "type": "function_call",
                          "status": "completed", "call_id": call.call_id, "name": call.name,
                          "arguments": call.arguments}
            r.output.append(item)
            self.events.function_called(r, item, self.items.append(item))
            if call.name in self.tool_names and out is not None:
                ran = True
                result: Item = {"id": new_id("item"), "type": "function_call_output",
                                "status": "completed", "call_id": call.call_id,
                                "output": out.output}
                self.events.tool_output(result, self.items.append(result))
        if ran and not r.handle.done():  # the reply goes on with the results: a new one
            self._done(r)
            self._announce(Reply(id=new_id("resp"), handle=r.handle,
                                 modalities=r.modalities, voice=r.voice,
                                 max_tokens=r.max_tokens))

    def _on_error(self, ev: ErrorEvent) -> None:
        r = self.current
        if r is not None and not getattr(ev.error, "recoverable", False):
            r.error = str(getattr(ev.error, "error", ev.error))[:300]

    def _done(self, r: Reply) -> None:
        """The reply ended (said, cut, cancelled or failed): its message closed, the
        door told, the conversation's own options back."""
        if self.current is r:
            self.current = None
        stream = self.conv.pipeline.llm.last_stream
        if r.error is not None:
            r.status = "failed"
        elif r.handle.interrupted:
            r.status = "cancelled"
        elif not r.output and stream is not None and stream.cut_by_length:
            # the token limit came before a word or a whole call (a forced call whose
            # arguments never closed): nothing was said
            r.status, r.reason = "incomplete", "max_output_tokens"
        else:
            r.status = "completed"
        if r.msg is not None:
            self._close(r, "completed" if r.status == "completed" else "incomplete")
        r.usage = stream.usage if stream is not None else None
        self.events.reply_done(r)
        log.info("reply %s %s: %d items, %.0f ms audio", r.id, r.status, len(r.output),
                 r.audio_ms)
        self.conv.restore(tools=r.own_tools)
        self.items.make_room()

    def _close(self, r: Reply, status: str) -> None:
        """The reply's message (`r.msg`) ends with what it said."""
        msg, said = r.msg, r.said
        assert msg is not None and said is not None
        part = msg["content"][0]
        if r.audio:  # cut: the caller heard what was sent
            part["transcript"] = said.heard if r.cut and said.heard is not None else said.text
        else:
            part["text"] = said.text
        msg["status"] = status
        self.events.message_closed(r, msg)


async def _until_done(h: SpeechHandle) -> None:
    await h
