"""One Realtime API session on one socket (`RealtimeSession`): the API's events over the
agent's one conversation (conversation/core.py `Conversation`: the end-of-turn policy, the
duplex controller, the thinker, TTS and ear, the mic and the paced speaker). The
conversation's user turns (conversation/user_turns.py) and replies (replies.py) become the
API's events here; the client's events become the conversation's verbs.

Server VAD on: the conversation hears the mic and ends the turn (speech_started /
speech_stopped / committed); its reply is the response. Speech over a reply pauses it and
the duplex controller decides, as on `/v1/talk`: a backchannel or a cough resumes it,
words cut it (the response is cancelled, `turn_detected`, and its item keeps what was
heard). Server VAD off: the client's commit makes the item (transcribed), and
`response.create` asks for the reply, the items as its context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .. import audio_formats
from ..audio_formats import PCM_RATE as RATE
from ..conversation import options
from ..conversation.core import Conversation
from ..conversation.frames import read_json, wire_json
from ..conversation.items import Item, Items, client_item, heard_text, new_id
from ..conversation.mic import MicInput
from ..conversation.outbox import Outbox
from ..conversation.replies import Replies, Reply
from ..conversation.speaker import Captions, SocketSpeaker
from ..conversation.user_turns import UserTurns
from ..settings import AgentSettings
from .events import (
    CLIENT_EVENTS,
    MAX_APPEND_BYTES,
    RealtimeError,
    SessionConfig,
    beta_part,
    error_event,
    event_name,
    update_session,
)
from .items import MAX_ITEM_CHARS, bounds

__all__ = ["RealtimeSession", "heard_text", "wire_json"]

log = logging.getLogger("voice_agent.realtime")

MAX_OUTBOX = 4000  # events waiting for a client that reads too slowly (~80 s of audio)


class RealtimeSession:
    """The session's state and its event handlers (see the module)."""

    def __init__(self, settings: AgentSettings, send: Callable[[str], Any], beta: bool,
                 check_voice: Callable[[str], Any]) -> None:
        self.id = new_id("sess")
        # The client asks for every reply: no greeting; a failed reply is said in its
        # response.done, not by the fallback phrase.
        self.settings = s = settings.model_copy(update={"greeting": "", "fallback_reply": ""})
        self.beta = beta  # the beta dialect (OpenAI-Beta: realtime=v1)
        self.outbox = Outbox(send, max_items=MAX_OUTBOX, name=f"realtime {self.id}")
        self._check_voice = check_voice  # async: the TTS's name for a voice, or raises
        self.items = Items(bounds, lambda item_id: self.emit(
            "conversation.item.deleted", item_id=item_id))
        self.conv = Conversation(
            s, mic=MicInput(RATE), sample_rate=RATE,
            on_user_turn=lambda msg: self.turns.user_turn(msg),
            speaker=SocketSpeaker(lambda pcm, first: self.replies.audio(pcm, first),
                                  lambda: None, sample_rate=RATE, frame_ms=s.tts_frame_ms),
            captions=Captions(lambda text: self.replies.text(text)), reports_first_audio=False)
        self.pipeline, self.tracker = self.conv.pipeline, self.conv.tracker
        self.tts = self.pipeline.tts
        self.turns = UserTurns(self.conv, self.items, self, self._sync_context)
        self.replies = Replies(self.conv, self.items, self, RATE)
        self.cfg = SessionConfig(**vars(self.conv.options))  # the agent's settings
        self._starting: asyncio.Task[None] | None = None

    # -- the wire --------------------------------------------------------------------

    def emit(self, ga_name: str, **fields: Any) -> None:
        name = event_name(ga_name, self.beta)
        if name is not None:
            self.outbox.text(wire_json({"type": name, "event_id": new_id("event"), **fields}))

    def error(self, e: RealtimeError, event_id: str | None = None) -> None:
        self.outbox.text(wire_json(error_event(e, event_id)))

    def _item_json(self, item: Item) -> dict[str, Any]:
        out = {"id": item["id"], "object": "realtime.item", **item}
        if self.beta and out.get("type") == "message":
            out["content"] = [beta_part(p) for p in out["content"]]
        return out

    def _part(self, part: dict[str, Any]) -> dict[str, Any]:
        return beta_part(part) if self.beta else part

    @property
    def response(self) -> Reply | None:
        """The response under way."""
        return self.replies.current

    @property
    def stalled(self) -> bool:
        """The client stopped reading (conversation/outbox.py): the session ends."""
        return self.outbox.stalled

    def start(self) -> None:
        """session.created at once; the conversation starts meanwhile (handlers wait)."""
        self.emit("session.created", session=self.session_json())
        self._starting = self.conv.start_soon(self.cfg, self._not_started)

    def _not_started(self) -> None:
        self.error(RealtimeError("internal", "the server could not start this session",
                                 type_="server_error"))
        self.outbox.close()  # the route ends the session when its sender returns

    def session_json(self) -> dict[str, Any]:
        return self.cfg.as_json(self.id, self.beta)

    async def handle(self, raw: str) -> None:
        """One client event; a bad one is answered with an `error` event, nothing more."""
        event_id = None
        try:
            try:
                ev = read_json(raw)
            except ValueError as e:
                raise RealtimeError("invalid_json", f"not an event: {e}") from None
            event_id = ev.get("event_id") if isinstance(ev.get("event_id"), str) else None
            kind = ev.get("type")
            if kind not in CLIENT_EVENTS:
                raise RealtimeError("invalid_event", f"unknown event type {str(kind)[:80]!r}; "
                                    f"this server takes {', '.join(CLIENT_EVENTS)}", "type")
            assert self._starting is not None, "start() first"
            await asyncio.shield(self._starting)
            await getattr(self, "on_" + kind.replace(".", "_"))(ev)
        except RealtimeError as e:
            self.error(e, event_id)
        except Exception:  # a bug of ours: said, logged, and the session goes on
            log.exception("realtime %s: handling an event failed", self.id)
            self.error(RealtimeError("internal", "the server failed on this event",
                                     type_="server_error"), event_id)

    # -- the client's events -----------------------------------------------------------

    async def on_session_update(self, ev: dict[str, Any]) -> None:
        cfg = update_session(self.cfg, ev.get("session"), self.conv.agent_turn())
        own = {t.id for t in self.conv.own_tools}
        if clash := {t["name"] for t in cfg.tools} & own:
            raise RealtimeError("invalid_value", f"tools {sorted(clash)} are the agent's own "
                                "(AGENT_TOOLS): name yours otherwise", "session.tools")
        if cfg.voice != self.cfg.voice:
            cfg.voice = await self._check_voice(cfg.voice)
        if cfg.turn_detection != self.cfg.turn_detection:
            self.turns.speech_item = None
        self.cfg = cfg
        await self.conv.configure(cfg)
        self.emit("session.updated", session=self.session_json())

    def _decode(self, b64: Any, param: str) -> Any:
        return audio_formats.decode(b64, self.cfg.input_format, param, MAX_APPEND_BYTES)

    async def on_input_audio_buffer_append(self, ev: dict[str, Any]) -> None:
        pcm = self._decode(ev.get("audio"), "audio")
        self.turns.push(pcm, audio_formats.rate(self.cfg.input_format))

    async def on_input_audio_buffer_commit(self, ev: dict[str, Any]) -> None:
        self.turns.commit()

    async def on_input_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        self.turns.clear()
        self.emit("input_audio_buffer.cleared")

    async def on_conversation_item_create(self, ev: dict[str, Any]) -> None:
        item, audio = client_item(ev.get("item"), self._decode,
                                        audio_formats.rate(self.cfg.input_format), self.items)
        prev = self.items.add(item, ev.get("previous_item_id"))
        self.emit("conversation.item.added", previous_item_id=prev, item=self._item_json(item))
        if audio is not None:  # an input_audio part: transcribed first
            self.turns.transcribe(item, audio)
        else:
            self.emit("conversation.item.done", item=self._item_json(item))
            await self._sync_context()

    async def on_conversation_item_delete(self, ev: dict[str, Any]) -> None:
        self.items.delete(ev.get("item_id"))
        self.emit("conversation.item.deleted", item_id=ev.get("item_id"))
        await self._sync_context()

    async def on_conversation_item_retrieve(self, ev: dict[str, Any]) -> None:
        item = self.items.find(ev.get("item_id"))
        self.emit("conversation.item.retrieved", item=self._item_json(item))

    async def on_conversation_item_truncate(self, ev: dict[str, Any]) -> None:
        item = self.items.find(ev.get("item_id"))
        if ev.get("content_index", 0) != 0:
            raise RealtimeError("invalid_value", "content_index must be 0", "content_index")
        self.replies.truncate(item, ev.get("audio_end_ms"))
        self.emit("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=int(ev["audio_end_ms"]))
        await self._sync_context()

    async def _sync_context(self) -> None:
        """The agent's chat context is the items' (the client may have changed them)."""
        await self.pipeline.agent.update_chat_ctx(self.items.chat_ctx(self.cfg.instructions))

    async def on_response_create(self, ev: dict[str, Any]) -> None:
        if (r := self.response) is not None:
            raise RealtimeError("conversation_already_has_active_response", "a response "
                                f"({r.id}) is in progress: cancel it or wait for its "
                                "response.done")
        opts = ev.get("response") or {}
        if not isinstance(opts, dict):
            raise RealtimeError("invalid_value", "response must be an object", "response")
        if opts.get("conversation", "auto") != "auto":
            raise RealtimeError("invalid_value", 'only conversation "auto" is supported '
                                "(no out-of-band responses)", "response.conversation")
        if "input" in opts:
            raise RealtimeError("invalid_value", "response.input is not supported: a response "
                                "answers the conversation (add items with "
                                "conversation.item.create first)", "response.input")
        cfg = self.cfg
        u = options.overrides(opts, cfg, "response", MAX_ITEM_CHARS)
        metadata = opts.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise RealtimeError("invalid_value", "metadata must be an object",
                                "response.metadata")
        await self.turns.all_transcribed()  # a reply answers what was said
        await self.replies.ask(
            self.items.chat_ctx(u.get("instructions", cfg.instructions), greeting=True),
            u.get("modalities", cfg.modalities), u.get("max_output_tokens",
                                                       cfg.max_output_tokens),
            u.get("tools"), u.get("tool_choice", cfg.tool_choice), metadata)

    async def on_response_cancel(self, ev: dict[str, Any]) -> None:
        r = self.response
        if r is None or (ev.get("response_id") not in (None, r.id)):
            raise RealtimeError("response_cancel_not_active", "there is no active response "
                                "to cancel")
        self.replies.cancel("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        raise RealtimeError("invalid_event", "output_audio_buffer.clear is for WebRTC/SIP; "
                            "over a WebSocket send response.cancel and "
                            "conversation.item.truncate")

    # -- the user's turns, as events (conversation/user_turns.py TurnEvents) -------------

    def speech_started(self, item_id: str, start_ms: int) -> None:
        self.emit("input_audio_buffer.speech_started", audio_start_ms=start_ms,
                  item_id=item_id)

    def speech_stopped(self, item_id: str, end_ms: int) -> None:
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=item_id)

    def committed(self, item: Item, previous: str | None) -> None:
        self.emit("input_audio_buffer.committed", previous_item_id=previous,
                  item_id=item["id"])
        self.emit("conversation.item.added", previous_item_id=previous,
                  item=self._item_json(item))

    def transcribed(self, item: Item, seconds: float, heard: str | Exception) -> None:
        if isinstance(heard, Exception):
            self.emit("conversation.item.input_audio_transcription.failed",
                      item_id=item["id"], content_index=0,
                      error={"type": "server_error", "code": "transcription_failed",
                             "message": str(heard)[:300]})
            return
        self.emit("conversation.item.input_audio_transcription.completed",
                  item_id=item["id"], content_index=0, transcript=heard,
                  usage={"type": "duration", "seconds": round(seconds, 3)})
        self.emit("conversation.item.done", item=self._item_json(item))

    # -- replies, as responses (conversation/replies.py ReplyEvents) ---------------------

    def _where(self, r: Reply, item: Item) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": item["id"], "output_index": r.index(item)}

    def reply_started(self, r: Reply) -> None:
        self.emit("response.created", response=self._response_json(r))

    def message_opened(self, r: Reply, msg: Item, previous: str | None) -> None:
        bare = self._item_json({**msg, "content": []})
        self.emit("response.output_item.added", response_id=r.id, output_index=r.index(msg),
                  item=bare)
        self.emit("conversation.item.added", previous_item_id=previous, item=bare)
        self.emit("response.content_part.added", **self._where(r, msg), content_index=0,
                  part=self._part(msg["content"][0]))

    def reply_text(self, r: Reply, msg: Item, text: str) -> None:
        kind = ("response.output_audio_transcript.delta" if r.audio
                else "response.output_text.delta")
        self.emit(kind, **self._where(r, msg), content_index=0, delta=text)

    def reply_audio(self, r: Reply, msg: Item, pcm: bytes) -> None:
        self.emit("response.output_audio.delta", **self._where(r, msg), content_index=0,
                  delta=audio_formats.encode(pcm, self.cfg.output_format))

    def function_called(self, r: Reply, call: Item, previous: str | None) -> None:
        where, index = self._where(r, call), r.index(call)
        opened = self._item_json({**call, "status": "in_progress", "arguments": ""})
        self.emit("response.output_item.added", response_id=r.id, output_index=index,
                  item=opened)
        self.emit("conversation.item.added", previous_item_id=previous, item=opened)
        self.emit("response.function_call_arguments.delta", **where, call_id=call["call_id"],
                  delta=call["arguments"])
        self.emit("response.function_call_arguments.done", **where, call_id=call["call_id"],
                  name=call["name"], arguments=call["arguments"])
        self.emit("response.output_item.done", response_id=r.id, output_index=index,
                  item=self._item_json(call))
        self.emit("conversation.item.done", item=self._item_json(call))

    def tool_output(self, item: Item, previous: str | None) -> None:
        self.emit("conversation.item.added", previous_item_id=previous,
                  item=self._item_json(item))
        self.emit("conversation.item.done", item=self._item_json(item))

    def message_closed(self, r: Reply, msg: Item) -> None:
        where, part = self._where(r, msg), msg["content"][0]
        if r.audio:
            if r.cut:  # the caller heard what was sent
                self.emit("conversation.item.truncated", item_id=msg["id"], content_index=0,
                          audio_end_ms=int(r.audio_ms))
            self.emit("response.output_audio.done", **where, content_index=0)
            self.emit("response.output_audio_transcript.done", **where, content_index=0,
                      transcript=part["transcript"])
        else:
            self.emit("response.output_text.done", **where, content_index=0, text=part["text"])
        self.emit("response.content_part.done", **where, content_index=0, part=self._part(part))
        self.emit("response.output_item.done", response_id=r.id,
                  output_index=where["output_index"], item=self._item_json(msg))
        self.emit("conversation.item.done", item=self._item_json(msg))

    def reply_done(self, r: Reply) -> None:
        self.emit("response.done", response=self._response_json(r))
        # the context holds the items (a client tool's call left an empty output there)
        self.conv.spawn(self._sync_context())

    def _response_json(self, r: Reply) -> dict[str, Any]:
        u = r.usage
        out_text, in_text = (u.completion_tokens, u.prompt_tokens) if u else (0, 0)
        out_audio = round(r.audio_ms / 80)  # the TTS's codec frames (12.5 a second)
        usage = {"total_tokens": in_text + out_text + out_audio, "input_tokens": in_text,
                 "output_tokens": out_text + out_audio,
                 "input_token_details": {"text_tokens": in_text, "audio_tokens": 0,
                                         "cached_tokens": 0},
                 "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio}}
        details = ({"type": "failed", "error": {"type": "server_error", "code":
                                                "response_failed", "message": r.error}}
                   if r.status == "failed" else {"type": r.status, "reason": r.reason}
                   if r.status in ("cancelled", "incomplete") else None)
        out: dict[str, Any] = {
            "id": r.id, "object": "realtime.response", "status": r.status,
            "status_details": details, "output": [self._item_json(o) for o in r.output],
            "usage": usage if r.status != "in_progress" else None,
            "conversation_id": self.id, "metadata": r.metadata,
            "max_output_tokens": r.max_tokens or "inf"}
        if self.beta:
            out.update(modalities=["text", "audio"] if r.audio else ["text"],
                       voice=r.voice, output_audio_format=self.cfg.output_format)
        else:
            out.update(output_modalities=list(r.modalities), audio={"output": {
                "format": audio_formats.MIME[self.cfg.output_format], "voice": r.voice}})
        return out

    async def close(self) -> None:
        """The client went (or the server stops): the conversation, its replies and
        transcriptions stop here, so no thinker or TTS work outlives the session."""
        if self._starting is not None:
            with contextlib.suppress(BaseException):
                await self._starting
        try:
            await self.conv.aclose()
        finally:
            self.outbox.close()

