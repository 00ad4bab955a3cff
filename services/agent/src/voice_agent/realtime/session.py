"""One Realtime API session on one socket (`RealtimeSession`): the API's events over the
agent's one conversation core (conversation/core.py `Conversation`, the one every door
runs: the end-of-turn policy, the duplex controller, the thinker, TTS and ear, the mic and
the paced speaker). What is left here is what only this API has: its items
(the client creates, deletes, truncates and retrieves them; realtime/items.py; mirrored to
the agent's chat context), responses as events, the input buffer a client commits when
server VAD is off, and client-run tools.

Server VAD on: the mic feeds the session; its policy ends the turn (speech_started /
speech_stopped / committed) and its reply is the response. Speech over a reply pauses it
and the duplex controller decides, as on `/v1/talk`: a backchannel or a cough resumes it,
words cut it (the response is cancelled, `turn_detected`, and its item keeps what was
sent: the reply's audio is paced, so what was sent is what was heard).
Server VAD off: the client's commit makes the item (transcribed here), `response.create`
asks for the reply (`generate_reply`, the items as its context).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, llm
from livekit.agents.llm import StopResponse
from livekit.agents.voice import SpeechHandle, io
from livekit.agents.voice.events import (
    ConversationItemAddedEvent,
    ErrorEvent,
    FunctionToolsExecutedEvent,
    SpeechCreatedEvent,
    UserStateChangedEvent,
)

from ..conversation.core import Conversation
from ..conversation.mic import MicFramer, MicInput
from ..conversation.outbox import Outbox
from ..conversation.speaker import SocketSpeaker
from ..conversation.turn_end import TurnEnd, eagerness_scale, endpointing
from ..duplex import DuplexState
from ..settings import AgentSettings
from ..speech_end import SpeechEnd
from .events import (
    CLIENT_EVENTS,
    G711_RATE,
    MAX_APPEND_BYTES,
    RATE,
    Dialect,
    RealtimeError,
    SessionConfig,
    TurnDetection,
    check_modalities,
    check_tool_choice,
    check_tools,
    decode_g711,
    encode_g711,
    error_event,
    max_tokens,
    new_id,
    update_session,
)
from .items import MAX_ITEM_CHARS, Items, heard_text, wire_json

log = logging.getLogger("voice_agent.realtime")

MIN_COMMIT_MS = 100  # a commit of less audio is an error, as the API's
MAX_BUFFER_S = 120.0  # uncommitted input audio kept (older is dropped, with an error)
MAX_OUTBOX = 4000  # events waiting for a client that reads too slowly (~80 s of audio)


@dataclass
class Response:
    id: str
    handle: SpeechHandle
    modalities: tuple[str, ...]
    voice: str
    max_tokens: int | None
    metadata: dict[str, Any] | None = None  # echoed (LiveKit's plugin matches its requests)
    output: list[dict[str, Any]] = field(default_factory=list)  # items, in order
    msg: dict[str, Any] | None = None  # the message being said
    # speech said within it (a slow tool's filler): its messages are the response's too
    inner: list[SpeechHandle] = field(default_factory=list)
    msg_of: SpeechHandle | None = None  # whose message `msg` is
    status: str = "in_progress"
    status_details: dict[str, Any] | None = None
    cancel_reason: str = "turn_detected"  # unless the client cancels it
    own_tools: bool = False  # response.create named its tools: the session's come back
    error: str | None = None  # the part that failed it
    audio_ms: float = 0.0  # sent


class _Captions(io.TextOutput):
    """The reply's words as the session releases them (in step with its audio)."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        super().__init__(label="realtime-captions", next_in_chain=None)
        self._on_text = on_text

    async def capture_text(self, text: str) -> None:
        if text:
            self._on_text(text)

    def flush(self) -> None:
        pass  # the response's events end it


def _client_tool(t: dict[str, Any]) -> llm.Tool:
    """A tool the Realtime client runs: its call ends the response (the client answers it
    with a function_call_output item and asks for the next)."""
    async def run(raw_arguments: dict[str, object]) -> None:
        raise StopResponse()

    return llm.function_tool(run, raw_schema={"name": t["name"], "description":
                                              t["description"], "parameters": t["parameters"]})


class RealtimeSession:
    """The session's state and its event handlers (see the module)."""

    def __init__(self, settings: AgentSettings, send: Callable[[str], Any], beta: bool,
                 check_voice: Callable[[str], Any]) -> None:
        self.id = new_id("sess")
        # The client asks for every reply: no greeting; a failed reply is said in its
        # response.done, not by the fallback phrase.
        self.settings = s = settings.model_copy(update={"greeting": "", "fallback_reply": ""})
        self.dialect = Dialect(beta)
        agent_turn = TurnDetection(threshold=s.vad_activation_threshold,
                                   silence_duration_ms=s.vad_silence_ms)
        self.cfg = SessionConfig(instructions=s.system_prompt, voice=s.tts_voice,
                                 temperature=s.llm_temperature, turn_detection=agent_turn,
                                 agent_turn=agent_turn)
        self.outbox = Outbox(send, max_items=MAX_OUTBOX, name=f"realtime {self.id}")
        self._check_voice = check_voice  # async: the TTS's name for a voice, or raises
        self.items = Items(self.emit, self._item_json)
        # the conversation as every door runs it; its turns in the agent's latency metrics
        self.mic = MicInput(RATE)
        self.conv = Conversation(
            s, mic=self.mic, sample_rate=RATE, on_user_turn=self._user_turn,
            speaker=SocketSpeaker(self._audio_out, lambda: None, sample_rate=RATE,
                                  frame_ms=s.tts_frame_ms),
            captions=_Captions(self._text_out), reports_first_audio=False)
        self.tracker, self.duplex = self.conv.tracker, self.conv.duplex
        self.pipeline = p = self.conv.pipeline
        self.stt, self.llm, self.tts = p.stt, p.llm, p.tts
        self.server_tools = {t.id: t for t in p.agent.tools}  # AGENT_TOOLS: run here
        self.duplex.on_state(self._on_duplex)
        for name, fn in (("speech_created", self._on_speech), ("error", self._on_error),
                         ("conversation_item_added", self._on_item),
                         ("function_tools_executed", self._on_tools),
                         ("user_state_changed", self._on_user_state)):
            p.session.on(name, fn)
        self.response: Response | None = None
        self._asked: dict[str, Any] | None = None  # response.create's options, being made
        self._transcribing: set[asyncio.Task[Any]] = set()
        self._starting: asyncio.Task[None] | None = None
        # input audio: at 16 kHz for the ear, since the last commit (server VAD off)
        self._buffer: list[rtc.AudioFrame] = []
        self._buffer_ms = 0.0
        self._appended_ms = 0.0  # audio appended since the last commit, as the client counts
        self._framer = MicFramer(RATE)  # the input buffer's (the mic's is MicInput's)
        # (perf time, audio ms so far): the recent appends, to place the VAD's moments
        self._received: deque[tuple[float, float]] = deque(maxlen=256)
        self._speech_item: str | None = None  # the user item server VAD is hearing
        # speech_started of speech over a reply, held until the duplex controller knows
        # it is a turn (a backchannel or a cough is none: nothing is said of it)
        self._held_start: dict[str, Any] | None = None

    # -- the wire --------------------------------------------------------------------

    def emit(self, ga_name: str, **fields: Any) -> None:
        name = self.dialect.name(ga_name)
        if name is not None:
            self._put({"type": name, "event_id": new_id("event"), **fields})

    def error(self, e: RealtimeError, event_id: str | None = None) -> None:
        self._put(error_event(e, event_id))

    def _put(self, ev: dict[str, Any]) -> None:
        self.outbox.text(wire_json(ev))

    def _item_json(self, item: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in item.items() if not k.startswith("_")}
        if self.dialect.beta and out.get("type") == "message":
            out["content"] = [{**p, "type": p["type"].removeprefix("output_")}
                              for p in out["content"]]
        return out

    @property
    def stalled(self) -> bool:
        """The client stopped reading (conversation/outbox.py): the session ends."""
        return self.outbox.stalled

    def start(self) -> None:
        """session.created at once; the conversation starts meanwhile (handlers wait)."""
        self.emit("session.created", session=self.session_json())
        self._starting = asyncio.create_task(self._start(), name=f"rt-{self.id}-start")

    async def _start(self) -> None:
        try:
            await self.conv.start()
            await self._apply()
        except Exception:  # a session that cannot start serves nothing: it ends, said
            log.exception("realtime %s: the conversation did not start", self.id)
            self.error(RealtimeError("internal", "the server could not start this session",
                                     type_="server_error"))
            self.outbox.close()  # the route ends the session when its sender returns
            raise

    async def _started(self) -> None:
        assert self._starting is not None, "start() first"
        await asyncio.shield(self._starting)

    def session_json(self) -> dict[str, Any]:
        return self.cfg.as_json(self.id, self.dialect.beta)

    async def handle(self, raw: str) -> None:
        """One client event; a bad one is answered with an `error` event, nothing more."""
        event_id = None
        try:
            try:
                ev = json.loads(raw, parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
                raise RealtimeError("invalid_json", f"the event is not JSON: {e}") from None
            if not isinstance(ev, dict):
                raise RealtimeError("invalid_json", "an event is a JSON object")
            event_id = ev.get("event_id") if isinstance(ev.get("event_id"), str) else None
            kind = ev.get("type")
            if kind not in CLIENT_EVENTS:
                raise RealtimeError("invalid_event", f"unknown event type {str(kind)[:80]!r}; "
                                    f"this server takes {', '.join(CLIENT_EVENTS)}", "type")
            await self._started()
            await getattr(self, "on_" + kind.replace(".", "_"))(ev)
        except RealtimeError as e:
            self.error(e, event_id)
        except Exception:  # a bug of ours: said, logged, and the session goes on
            log.exception("realtime %s: handling an event failed", self.id)
            self.error(RealtimeError("internal", "the server failed on this event",
                                     type_="server_error"), event_id)

    # -- session -----------------------------------------------------------------------

    async def on_session_update(self, ev: dict[str, Any]) -> None:
        cfg = update_session(self.cfg, ev.get("session"))
        if clash := {t["name"] for t in cfg.tools} & set(self.server_tools):
            raise RealtimeError("invalid_value", f"tools {sorted(clash)} are the agent's own "
                                "(AGENT_TOOLS): name yours otherwise", "session.tools")
        if cfg.voice != self.cfg.voice:
            cfg.voice = await self._check_voice(cfg.voice)
        if cfg.turn_detection != self.cfg.turn_detection:
            self._speech_item = None
        self.cfg = cfg
        await self._apply()
        self.emit("session.updated", session=self.session_json())

    async def _apply(self) -> None:
        """The session's configuration, on the conversation's parts and policy."""
        cfg, p, s = self.cfg, self.pipeline, self.settings
        self.tts.update_options(voice=cfg.voice)
        self.llm.update_options(max_tokens=cfg.max_output_tokens or s.llm_max_tokens,
                                temperature=cfg.temperature)
        self._set_modalities(cfg.modalities)
        await p.agent.update_instructions(cfg.instructions)
        await p.agent.update_tools([*self.server_tools.values(), *map(_client_tool, cfg.tools)])
        td = cfg.turn_detection
        if td is None:  # the client commits its turns (the mic then feeds no session)
            p.session.update_options(turn_detection="manual")
            return
        lo, hi = endpointing(s, td.eagerness)
        if isinstance(p.turn, TurnEnd):  # its own waits (a word or two's) scale alike
            p.turn.scale = eagerness_scale(td.eagerness)
        p.session.update_options(turn_detection=p.turn,  # type: ignore[arg-type]
                                 endpointing_opts={"min_delay": lo, "max_delay": hi})
        p.vad.update_options(
            min_silence_duration=(td.silence_duration_ms or s.vad_silence_ms) / 1000,
            activation_threshold=td.threshold or s.vad_activation_threshold)
        self.duplex.allow_interruptions = td.interrupt_response and s.allow_interruptions

    def _set_modalities(self, modalities: tuple[str, ...]) -> None:
        self.conv.set_audio_enabled("audio" in modalities)

    # -- input audio -------------------------------------------------------------------

    def _decode(self, b64: Any, param: str) -> np.ndarray:
        """Input audio (base64, the session's input format) as int16 samples at 24 kHz
        (pcm16) or 8 kHz (G.711)."""
        if not isinstance(b64, str):
            raise RealtimeError("invalid_value", f"{param} must be base64 audio", param)
        if len(b64) > MAX_APPEND_BYTES:
            raise RealtimeError("invalid_value", f"{param} is {len(b64):,} bytes of base64; "
                                f"an event takes at most {MAX_APPEND_BYTES:,}: send the audio "
                                "in smaller appends", param)
        try:
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeError("invalid_value", f"{param} is not valid base64", param) from None
        fmt = self.cfg.input_format
        if fmt != "pcm16":
            return decode_g711(data, fmt)
        if len(data) % 2:
            raise RealtimeError("invalid_value", f"{param}: pcm16 audio is whole 16-bit "
                                f"samples; {len(data)} bytes is not", param)
        return np.frombuffer(data, dtype=np.int16)

    def _input_rate(self) -> int:
        return RATE if self.cfg.input_format == "pcm16" else G711_RATE

    async def on_input_audio_buffer_append(self, ev: dict[str, Any]) -> None:
        pcm = self._decode(ev.get("audio"), "audio")
        rate = self._input_rate()
        self._appended_ms += len(pcm) / rate * 1000
        total = (self._received[-1][1] if self._received else 0.0) + len(pcm) / rate * 1000
        self._received.append((time.perf_counter(), total))
        if self.cfg.turn_detection is not None:  # the conversation hears it
            if self.mic.input_rate != rate:  # the input format changed
                self.mic.mic = MicFramer(rate)
                self.mic.input_rate = rate
            self.mic.push(pcm.tobytes())
            return
        if self._framer.input_rate != rate:
            self._framer = MicFramer(rate)
        for f in self._framer.push(pcm.tobytes()):
            self._buffer.append(f)
            self._buffer_ms += f.duration * 1000
        if self._buffer_ms > MAX_BUFFER_S * 1000:
            dropped = 0.0
            while self._buffer_ms > MAX_BUFFER_S * 1000:
                d = self._buffer.pop(0).duration * 1000
                self._buffer_ms -= d
                dropped += d
            raise RealtimeError("input_audio_buffer_full", f"over {MAX_BUFFER_S:.0f} s of "
                                f"uncommitted audio: the oldest {dropped:.0f} ms were dropped "
                                "(commit or clear the buffer)")

    async def on_input_audio_buffer_commit(self, ev: dict[str, Any]) -> None:
        # Counted as appended: the resampler and the 20 ms framer hold the last few ms
        # back (100 ms appended once read as 60), so the framer's rest is taken here too.
        if self._appended_ms < MIN_COMMIT_MS - 0.5:
            raise RealtimeError("input_audio_buffer_commit_empty", "buffer too small: "
                                f"expected at least {MIN_COMMIT_MS} ms of audio, have "
                                f"{self._appended_ms:.0f} ms")
        td = self.cfg.turn_detection
        if td is not None:  # server VAD: the client ends the turn it is hearing
            self._appended_ms = 0.0
            self.pipeline.session.commit_user_turn(skip_reply=not td.create_response)
            return
        frames = self._buffer + self._framer.flush()
        self._clear_buffer()
        now = time.perf_counter()  # the client ended the turn: its commit is the end
        self.tracker.user_turn_ended(SpeechEnd(at=now, decided=now, silence_s=0.0))
        self.tracker.turn_decided(now)
        self._transcribe(self._commit(new_id("item")), frames)

    async def on_input_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        if self.cfg.turn_detection is not None:
            self.pipeline.session.clear_user_turn()
            self._speech_item = None
        self._framer.flush()
        self._clear_buffer()
        self.emit("input_audio_buffer.cleared")

    def _clear_buffer(self) -> None:
        self._buffer, self._buffer_ms, self._appended_ms = [], 0.0, 0.0

    def _audio_ms_at(self, t: float) -> float:
        """The input audio's position (ms appended) when perf time `t` was."""
        at = 0.0
        for when, ms in self._received:
            if when > t:
                break
            at = ms
        return at

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        td = self.cfg.turn_detection
        if ev.new_state != "speaking" or td is None or self._speech_item is not None:
            return  # speech resumed within a turn still open: the same item
        self._speech_item = new_id("item")
        now_ms = self._received[-1][1] if self._received else 0.0
        # the VAD says so after its minimum speech
        start = now_ms - self.settings.vad_min_speech_ms - td.prefix_padding_ms
        started = {"audio_start_ms": int(max(0.0, start)), "item_id": self._speech_item}
        if self.duplex.state == DuplexState.PAUSED:  # over a reply: a turn, or not?
            self._held_start = started
        else:
            self.emit("input_audio_buffer.speech_started", **started)

    def _on_duplex(self, state: DuplexState) -> None:
        held = self._held_start
        if held is None:
            return
        if state == DuplexState.INTERRUPTING:  # words: the speech cuts the reply
            self._started_speech()
        elif state == DuplexState.SPEAKING:  # a backchannel or a noise: the reply goes on
            self._held_start, self._speech_item = None, None

    def _started_speech(self) -> None:
        if self._held_start is not None:
            started, self._held_start = self._held_start, None
            self.emit("input_audio_buffer.speech_started", **started)

    async def _user_turn(self, msg: llm.ChatMessage) -> None:
        """The conversation ended a user turn (server VAD): it is the item its speech
        started, committed with its transcript; answered unless create_response is off."""
        self._started_speech()  # if it was held
        item_id, self._speech_item = self._speech_item or new_id("item"), None
        msg.id = item_id
        end = self.tracker.speech_end  # the VAD's latest located end (speech_end.py)
        end_ms = self._audio_ms_at(end.at) if end is not None else self._appended_ms
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=int(end_ms),
                  item_id=item_id)
        item = self._commit(item_id)
        seconds, self._appended_ms = self._appended_ms / 1000, 0.0
        self.conv.when_heard(msg.text_content or "",
                             lambda words: self._transcribed(item, seconds, words))
        td = self.cfg.turn_detection
        if td is None or not td.create_response:
            await self._sync_context()  # the item is in the context, unanswered
            raise StopResponse()

    def _commit(self, item_id: str) -> dict[str, Any]:
        """The user's audio as an item (its transcript follows: `_transcribed`)."""
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}]}
        prev = self.items.append(item, announce=False)
        self.emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item_id)
        self.emit("conversation.item.added", previous_item_id=prev, item=item)
        return item

    def _transcribe(self, item: dict[str, Any], frames: list[rtc.AudioFrame]) -> None:
        """The item's transcript, in the background (a reply waits for it)."""
        async def run() -> None:
            try:
                ev = await self.stt.transcribe(frames, None, NOT_GIVEN,
                                               DEFAULT_API_CONNECT_OPTIONS)
                heard: str | Exception = ev.alternatives[0].text if ev.alternatives else ""
            except Exception as e:  # the ear failed: the item stays, untranscribed
                log.warning("realtime %s: transcription failed: %s", self.id, e)
                heard = e
            self._transcribed(item, sum(f.duration for f in frames), heard)
            await self._sync_context()

        task = self.conv.spawn(run())
        self._transcribing.add(task)
        task.add_done_callback(self._transcribing.discard)

    def _transcribed(self, item: dict[str, Any], seconds: float, heard: str | Exception) -> None:
        """The item's transcript said, or why there is none."""
        if isinstance(heard, Exception):
            self.emit("conversation.item.input_audio_transcription.failed",
                      item_id=item["id"], content_index=0,
                      error={"type": "server_error", "code": "transcription_failed",
                             "message": str(heard)[:300]})
            return
        item["content"][0]["transcript"] = heard
        self.emit("conversation.item.input_audio_transcription.completed",
                  item_id=item["id"], content_index=0, transcript=heard,
                  usage={"type": "duration", "seconds": round(seconds, 3)})
        self.emit("conversation.item.done", item=item)

    # -- conversation items ------------------------------------------------------------

    async def on_conversation_item_create(self, ev: dict[str, Any]) -> None:
        item = self.items.create(ev.get("item"), ev.get("previous_item_id"), self._decode,
                                 self._input_rate())
        if item.get("_audio") is not None:  # an input_audio part: transcribed first
            self._transcribe(item, item.pop("_audio"))
        else:
            self.emit("conversation.item.done", item=self._item_json(item))
            await self._sync_context()

    async def on_conversation_item_delete(self, ev: dict[str, Any]) -> None:
        self.items.delete(ev.get("item_id"))
        await self._sync_context()

    async def on_conversation_item_retrieve(self, ev: dict[str, Any]) -> None:
        item = self.items.find(ev.get("item_id"))
        self.emit("conversation.item.retrieved", item=self._item_json(item))

    async def on_conversation_item_truncate(self, ev: dict[str, Any]) -> None:
        item = self.items.find(ev.get("item_id"))
        end = ev.get("audio_end_ms")
        if item.get("role") != "assistant" or "_audio_ms" not in item:
            raise RealtimeError("invalid_value", "only an assistant message with audio can "
                                "be truncated", "item_id")
        if ev.get("content_index", 0) != 0:
            raise RealtimeError("invalid_value", "content_index must be 0", "content_index")
        if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end <= item["_audio_ms"]:
            raise RealtimeError("invalid_value", f"audio_end_ms must be 0..{item['_audio_ms']:.0f}"
                                " (the item's audio)", "audio_end_ms")
        r = self.response
        if r is not None and r.msg is item:
            self._cancel("client_cancelled")
        self._truncate(item, end)
        await self._sync_context()

    def _truncate(self, item: dict[str, Any], end_ms: float) -> None:
        part = item["content"][0]
        full = item.get("_text", part.get("transcript") or "")
        part["transcript"] = heard_text(full, end_ms, item["_audio_ms"], True)
        item["_audio_ms"] = min(item["_audio_ms"], end_ms)
        self.emit("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=int(end_ms))

    async def _sync_context(self) -> None:
        """The agent's chat context is the items' (the client may have changed them)."""
        await self.pipeline.agent.update_chat_ctx(self.items.chat_ctx(self.cfg.instructions))

    # -- responses ---------------------------------------------------------------------

    async def on_response_create(self, ev: dict[str, Any]) -> None:
        if self.response is not None:
            raise RealtimeError("conversation_already_has_active_response", "a response "
                                f"({self.response.id}) is in progress: cancel it or wait for "
                                "its response.done")
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
        modalities = cfg.modalities
        for key in ("output_modalities", "modalities"):
            if opts.get(key) is not None:
                modalities = check_modalities(opts[key], f"response.{key}")
        instructions = opts.get("instructions")
        if instructions is not None and (not isinstance(instructions, str)
                                         or len(instructions) > MAX_ITEM_CHARS):
            raise RealtimeError("invalid_value", "instructions must be a string of at most "
                                f"{MAX_ITEM_CHARS:,} characters", "response.instructions")
        metadata = opts.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise RealtimeError("invalid_value", "metadata must be an object",
                                "response.metadata")
        tools = check_tools(opts["tools"]) if "tools" in opts else cfg.tools
        choice = (check_tool_choice(opts["tool_choice"], tools) if "tool_choice" in opts
                  else cfg.tool_choice)
        limit = cfg.max_output_tokens
        for key in ("max_output_tokens", "max_response_output_tokens"):
            if key in opts:
                limit = max_tokens(opts[key], f"response.{key}")
        if self._transcribing:  # a reply answers what was said, transcript included
            await asyncio.gather(*list(self._transcribing), return_exceptions=True)
        p = self.pipeline
        # this response's own settings; the session's come back at its end (`_done`)
        self._set_modalities(modalities)
        self.llm.update_options(max_tokens=limit or self.settings.llm_max_tokens)
        if "tools" in opts:
            await p.agent.update_tools([*self.server_tools.values(), *map(_client_tool, tools)])
        ctx = self.items.chat_ctx(cfg.instructions if instructions is None else instructions,
                                  greeting=True)
        self._asked = {"modalities": modalities, "max_tokens": limit, "metadata": metadata,
                       "own_tools": "tools" in opts}
        try:
            p.session.generate_reply(
                chat_ctx=ctx, tool_choice=_tool_choice(choice) if tools or self.server_tools
                else "none")
        finally:
            self._asked = None

    async def on_response_cancel(self, ev: dict[str, Any]) -> None:
        r = self.response
        if r is None or (ev.get("response_id") not in (None, r.id)):
            raise RealtimeError("response_cancel_not_active", "there is no active response "
                                "to cancel")
        self._cancel("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        raise RealtimeError("invalid_event", "output_audio_buffer.clear is for WebRTC/SIP; "
                            "over a WebSocket send response.cancel and "
                            "conversation.item.truncate")

    def _cancel(self, reason: str) -> None:
        r = self.response
        if r is not None and not r.handle.done():
            r.cancel_reason = reason
            r.handle.interrupt(force=True)

    def _on_speech(self, ev: SpeechCreatedEvent) -> None:
        """A reply the conversation makes: a response from when it is scheduled (a reply
        started before the user's turn ended is dropped unseen if they go on)."""
        asked = self._asked or {}
        cfg = self.cfg
        if ev.source == "say" and self._asked is None and self.response is not None:
            self.response.inner.append(ev.speech_handle)  # a tool's filler, said meanwhile
            return
        r = Response(id=new_id("resp"), handle=ev.speech_handle,
                     modalities=asked.get("modalities", cfg.modalities), voice=cfg.voice,
                     max_tokens=asked.get("max_tokens", cfg.max_output_tokens),
                     metadata=asked.get("metadata"), own_tools=asked.get("own_tools", False))
        if self._asked is not None:  # the client's: it is the response from now
            self._announce(r)
        self.conv.spawn(self._follow(r))

    def _announce(self, r: Response) -> None:
        if self.response is r:
            return
        if self.response is not None:  # its done callback has not run yet
            self._done(self.response)
        self.response = r
        self.emit("response.created", response=self._response_json(r))

    async def _follow(self, r: Response) -> None:
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
        cur = self.response
        if cur is not None and cur.handle is r.handle:  # r, or the reply it went on to
            self._done(cur)

    def _current(self) -> Response | None:
        """The response whose words or audio come now (announced if not yet)."""
        speech = self.pipeline.session.current_speech
        r = self.response
        if r is not None and (speech is None or r.handle is speech or speech in r.inner):
            return r
        return None

    def _message(self, r: Response) -> dict[str, Any]:
        """The response's message, opened at its first words or audio (one a speech)."""
        speech = self.pipeline.session.current_speech
        if r.msg is not None and speech is not None and r.msg_of is not speech:
            self._close_message(r, r.msg, "completed")  # the filler's, said
            r.msg = None
        if r.msg is None:
            r.msg_of = speech
            audio = "audio" in r.modalities
            part = ({"type": "output_audio", "transcript": ""} if audio
                    else {"type": "output_text", "text": ""})
            msg = {"id": new_id("item"), "object": "realtime.item", "type": "message",
                   "role": "assistant", "status": "in_progress", "content": [part], "_text": ""}
            if audio:
                msg["_audio_ms"] = 0.0
            prev = self.items.append(msg, announce=False)
            r.output.append(msg)
            r.msg = msg
            where = self._where(r, msg)
            bare = self._item_json({**msg, "content": []})
            self.emit("response.output_item.added", response_id=r.id,
                      output_index=where["output_index"], item=bare)
            self.emit("conversation.item.added", previous_item_id=prev, item=bare)
            self.emit("response.content_part.added", **where, content_index=0, part={
                **part, "type": self.dialect.part(part["type"].removeprefix("output_"))})
        return r.msg

    def _where(self, r: Response, item: dict[str, Any]) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": item["id"],
                "output_index": next(i for i, o in enumerate(r.output) if o is item)}

    def _text_out(self, text: str) -> None:
        """The reply's words: an audio reply's transcript as its audio plays, a text
        reply's as the thinker writes it."""
        r = self._current()
        if r is None:
            return
        msg = self._message(r)
        msg["_text"] += text
        kind = ("response.output_audio_transcript.delta" if "audio" in r.modalities
                else "response.output_text.delta")
        self.emit(kind, **self._where(r, msg), content_index=0, delta=text)

    def _audio_out(self, pcm: bytes, first: bool) -> None:
        """One paced tick of the reply's audio (conversation/speaker.py)."""
        r = self._current()
        if r is None:
            return
        msg = self._message(r)
        fmt = self.cfg.output_format
        if fmt != "pcm16":
            pcm = encode_g711(_to_8k(np.frombuffer(pcm, dtype=np.int16)), fmt)
        if first:
            self.tracker.audio_published()  # the turn's first audio left
        r.audio_ms += len(pcm) / (2 * RATE if fmt == "pcm16" else G711_RATE) * 1000
        msg["_audio_ms"] = r.audio_ms
        self.emit("response.output_audio.delta", **self._where(r, msg), content_index=0,
                  delta=base64.b64encode(pcm).decode("ascii"))

    def _on_item(self, ev: ConversationItemAddedEvent) -> None:
        """The conversation's own record of a reply: its id becomes the message's, its
        text what was said (all of it, or what was heard before a cut)."""
        item = ev.item
        r = self.response
        if getattr(item, "role", None) != "assistant" or r is None or r.msg is None:
            return
        item.id = r.msg["id"]
        r.msg["_said"] = item.text_content or ""

    def _on_tools(self, ev: FunctionToolsExecutedEvent) -> None:
        """The reply's calls: each a function_call item of the response; the agent's own
        tools' results items of the conversation (their follow-up is the next reply)."""
        r = self._current() or self.response
        if r is None:
            return
        ran = False
        for call, out in zip(ev.function_calls, ev.function_call_outputs, strict=False):
            self._function_call(r, call)
            if call.name in self.server_tools and out is not None:
                ran = True
                item = {"id": new_id("item"), "object": "realtime.item",
                        "type": "function_call_output", "status": "completed",
                        "call_id": call.call_id, "output": out.output}
                prev = self.items.append(item, announce=False)
                self.emit("conversation.item.added", previous_item_id=prev, item=item)
                self.emit("conversation.item.done", item=item)
        if ran and not r.handle.done():  # the reply goes on with the results: a response
            self._done(r)
            self._announce(Response(id=new_id("resp"), handle=r.handle,
                                    modalities=r.modalities, voice=r.voice,
                                    max_tokens=r.max_tokens))

    def _function_call(self, r: Response, call: llm.FunctionCall) -> None:
        item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call",
                "status": "in_progress", "call_id": call.call_id, "name": call.name,
                "arguments": ""}
        prev = self.items.append(item, announce=False)
        r.output.append(item)
        where = self._where(r, item)
        self.emit("response.output_item.added", response_id=r.id,
                  output_index=where["output_index"], item=self._item_json(item))
        self.emit("conversation.item.added", previous_item_id=prev, item=self._item_json(item))
        self.emit("response.function_call_arguments.delta", **where, call_id=call.call_id,
                  delta=call.arguments)
        item["arguments"], item["status"] = call.arguments, "completed"
        self.emit("response.function_call_arguments.done", **where, call_id=call.call_id,
                  name=call.name, arguments=call.arguments)
        self.emit("response.output_item.done", response_id=r.id,
                  output_index=where["output_index"], item=self._item_json(item))
        self.emit("conversation.item.done", item=self._item_json(item))

    def _on_error(self, ev: ErrorEvent) -> None:
        r = self.response
        if r is not None and not getattr(ev.error, "recoverable", False):
            r.error = str(getattr(ev.error, "error", ev.error))[:300]

    def _done(self, r: Response) -> None:
        """The response ended (said, cut, cancelled or failed): its message closed,
        response.done, the session's own settings back."""
        if self.response is r:
            self.response = None
        h = r.handle
        stream = self.llm.last_stream
        if r.error is not None:
            r.status = "failed"
            r.status_details = {"type": "failed", "error": {
                "type": "server_error", "code": "response_failed", "message": r.error}}
        elif h.interrupted:
            r.status = "cancelled"
            r.status_details = {"type": "cancelled", "reason": r.cancel_reason}
        elif not r.output and stream is not None and stream.cut_by_length:
            # the token limit came before a word or a whole call (a forced call whose
            # arguments never closed): nothing was said, and OpenAI says "incomplete"
            r.status = "incomplete"
            r.status_details = {"type": "incomplete", "reason": "max_output_tokens"}
        else:
            r.status = "completed"
        if r.msg is not None:
            self._close_message(r, r.msg, "completed" if r.status == "completed"
                                else "incomplete")
        usage = stream.usage if stream is not None else None
        self.emit("response.done", response=self._response_json(r, usage))
        log.info("realtime %s: response %s %s: %d items, %.0f ms audio", self.id, r.id,
                 r.status, len(r.output), r.audio_ms)
        self._set_modalities(self.cfg.modalities)
        self.llm.update_options(max_tokens=self.cfg.max_output_tokens
                                or self.settings.llm_max_tokens)
        self.items.make_room()
        if r.own_tools:
            self.conv.spawn(self.pipeline.agent.update_tools(
                [*self.server_tools.values(), *map(_client_tool, self.cfg.tools)]))
        # the context holds the items (a client tool's call left an empty output there)
        self.conv.spawn(self._sync_context())

    def _close_message(self, r: Response, msg: dict[str, Any], status: str) -> None:
        where = self._where(r, msg)
        audio = "audio" in r.modalities
        part = msg["content"][0]
        cut = r.status == "cancelled" and r.cancel_reason == "turn_detected"
        said = msg.get("_said", msg["_text"])
        if audio:
            part["transcript"] = said if cut else msg["_text"]
            if cut:  # the caller heard what was sent
                self.emit("conversation.item.truncated", item_id=msg["id"], content_index=0,
                          audio_end_ms=int(msg["_audio_ms"]))
            self.emit("response.output_audio.done", **where, content_index=0)
            self.emit("response.output_audio_transcript.done", **where, content_index=0,
                      transcript=part["transcript"])
        else:
            part["text"] = msg["_text"]
            self.emit("response.output_text.done", **where, content_index=0,
                      text=part["text"])
        msg["status"] = status
        self.emit("response.content_part.done", **where, content_index=0,
                  part={**part, "type": self.dialect.part(part["type"].removeprefix("output_"))})
        self.emit("response.output_item.done", response_id=r.id,
                  output_index=where["output_index"], item=self._item_json(msg))
        self.emit("conversation.item.done", item=self._item_json(msg))

    def _response_json(self, r: Response,
                       u: llm.CompletionUsage | None = None) -> dict[str, Any]:
        out_text = u.completion_tokens if u else 0
        out_audio = round(r.audio_ms / 80)  # the TTS's codec frames (12.5 a second)
        in_text = u.prompt_tokens if u else 0
        usage = {"total_tokens": in_text + out_text + out_audio, "input_tokens": in_text,
                 "output_tokens": out_text + out_audio,
                 "input_token_details": {"text_tokens": in_text, "audio_tokens": 0,
                                         "cached_tokens": 0},
                 "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio}}
        mods = list(r.modalities)
        out: dict[str, Any] = {
            "id": r.id, "object": "realtime.response", "status": r.status,
            "status_details": r.status_details,
            "output": [self._item_json(o) for o in r.output],
            "usage": usage if r.status != "in_progress" else None,
            "conversation_id": self.id, "metadata": r.metadata}
        if self.dialect.beta:
            out.update(modalities=["text", "audio"] if "audio" in mods else ["text"],
                       voice=r.voice, output_audio_format=self.cfg.output_format,
                       max_output_tokens=r.max_tokens or "inf")
        else:
            out.update(output_modalities=mods, max_output_tokens=r.max_tokens or "inf",
                       audio={"output": {"format": self.cfg.as_json(self.id, False)["audio"]
                                         ["output"]["format"], "voice": r.voice}})
        return out

    # -- life --------------------------------------------------------------------------

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


async def _until_done(h: SpeechHandle) -> None:
    await h


def _tool_choice(choice: str | dict[str, Any]) -> llm.ToolChoice:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice  # type: ignore[return-value]


def _to_8k(pcm: np.ndarray) -> np.ndarray:
    """24 kHz -> 8 kHz for G.711: the mean of each three samples (a low-pass that keeps
    every tick whole: a resampler would hold samples back across ticks)."""
    n = len(pcm) // 3 * 3
    return pcm[:n].reshape(-1, 3).mean(axis=1).astype(np.int16)


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (RFC 8259): Python's parser takes them, and echoed
    back (a response's metadata) they broke a browser's JSON.parse."""
    raise ValueError(f"{name} is not a JSON value")


