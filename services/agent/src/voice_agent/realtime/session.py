"""One Realtime API session on one socket (`RealtimeSession`): the input audio buffer and
its server VAD, the conversation's items, and one response at a time (the thinker's
text -> the TTS's audio, or function calls), all as the API's events.

The parts are the agent's own (plugins/: the thinker, the TTS, the ear; Silero VAD); no
AgentSession here, because the Realtime client, not the agent, owns the conversation
(items come and go by its events; a response starts when it asks, or on server VAD).

Barge-in: on server VAD with `interrupt_response`, speech over a reply cancels it and the
reply's item keeps only what the caller heard. The client plays audio as it arrives, so
"heard" is the time since the reply's first audio delta, at most the audio sent. A reply
all made (response.done sent; the TTS runs ahead of real time) may still be playing: speech
then truncates its item the same way, and the response stays completed. The
transcript is cut at the last whole word that audio covered (by the reply's measured
characters per second of audio once it is all made, by SPEECH_CHARS_PER_S before).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, llm, stt, vad

from ..conversation.mic import VAD_RATE, MicFramer
from ..conversation.outbox import Outbox
from ..conversation.parts import build_parts
from ..conversation.turn_end import end_of_turn_wait
from ..metrics import WASTED, TurnTracker
from ..plugins.stt import PREPARE_AFTER, RecogniserFeed
from ..settings import AgentSettings
from ..speech_end import SpeechEnd, TimedVADStream
from ..tools import load_tools, run_tool, schema
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

log = logging.getLogger("voice_agent.realtime")
# One try per thinker call: a request it refused is refused again (a retry only delays).
ONCE = APIConnectOptions(max_retry=0, retry_interval=0.1, timeout=10.0)

MIN_COMMIT_MS = 100  # a commit of less audio is an error, as the API's
MAX_BUFFER_S = 120.0  # uncommitted input audio kept (older is dropped, with an error)
# What one session holds (a client's items and the replies' own; documented in the README):
# items over either bound are refused with `conversation_too_large`, and the agent's own
# replies make room by deleting the oldest items (conversation.item.deleted).
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 100_000  # one item's text: its parts, a call's arguments or output
MAX_CONVERSATION_CHARS = 1_000_000  # all items' text together (~4 MB at most)
MAX_OUTBOX = 4000  # events waiting for a client that reads too slowly (~80 s of audio)
MAX_TOOL_ROUNDS = 3  # responses in a row that may run the agent's tools
SPEECH_CHARS_PER_S = 14.0  # a reply's pace when the TTS does not say what it read
AUDIO_LAG_S = 0.24  # the TTS's audio lags the text it has read by a few 80 ms frames


@dataclass
class Response:
    id: str
    modalities: tuple[str, ...]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    instructions: str
    temperature: float | None
    max_tokens: int | None
    voice: str
    metadata: dict[str, Any] | None = None  # echoed (LiveKit's plugin matches its requests)
    output: list[dict[str, Any]] = field(default_factory=list)  # items, in order
    status: str = "in_progress"
    status_details: dict[str, Any] | None = None
    usage: llm.CompletionUsage | None = None
    task: asyncio.Task[None] | None = None
    # the reply's audio: when its first delta went out, how much went, whether it is all
    first_audio_at: float | None = None
    audio_ms: float = 0.0
    audio_done: bool = False
    # A reply made while server VAD still holds the user's turn open (their words, not
    # yet an item, ride along): its events wait here until the turn ends, and are dropped
    # with it if the user goes on. None: its events go out as they come.
    held: list[dict[str, Any]] | None = None
    pending_user: str | None = None


    def heard_ms(self) -> float:
        """The audio the caller has heard by now (it plays deltas as they arrive)."""
        if self.first_audio_at is None:
            return 0.0
        return min(self.audio_ms, (time.monotonic() - self.first_audio_at) * 1000)


def heard_text(text: str, heard_ms: float, audio_ms: float, all_audio: bool,
               read: int | None = None) -> str:
    """The part of a reply's `text` that `heard_ms` of its audio spoke, to the last whole
    word: `read`, the characters the TTS had read by the audio heard (less its lag), when
    it says; else by the reply's characters per second of audio once it is all made, by
    SPEECH_CHARS_PER_S before."""
    if heard_ms >= audio_ms and all_audio:
        return text
    if read is not None:
        chars = float(read)
    elif all_audio and audio_ms > 0:
        chars = len(text) * heard_ms / audio_ms
    else:
        chars = heard_ms / 1000 * SPEECH_CHARS_PER_S
    n = min(len(text), int(chars))
    if n < len(text) and not text[n].isspace():
        n = text.rfind(" ", 0, n) + 1  # back to the word's start: only whole words heard
    return text[:n].rstrip()


def wire_json(ev: dict[str, Any]) -> str:
    """An event as a text frame. A client's JSON may escape a lone surrogate ("\\ud800"),
    and an error that quotes it then holds one: UTF-8 cannot carry it, and sending it
    raised in the sender and ended the session. Such an event goes escaped (ASCII)."""
    text = json.dumps(ev, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(ev)
    return text


class RealtimeSession:
    """The session's state and its event handlers; `run` until the client goes."""

    def __init__(self, settings: AgentSettings, send: Callable[[str], Any], beta: bool,
                 check_voice: Callable[[str], Any]) -> None:
        self.id = new_id("sess")
        self.settings = s = settings
        self.dialect = Dialect(beta)
        agent_turn = TurnDetection(threshold=s.vad_activation_threshold,
                                   silence_duration_ms=s.vad_silence_ms)
        self.cfg = SessionConfig(instructions=s.system_prompt, voice=s.tts_voice,
                                 temperature=s.llm_temperature, turn_detection=agent_turn,
                                 agent_turn=agent_turn)
        self.outbox = Outbox(send, max_items=MAX_OUTBOX, name=f"realtime {self.id}")
        self._check_voice = check_voice  # async: the TTS's name for a voice, or raises
        self.items: list[dict[str, Any]] = []
        # the conversation's parts as every door builds them, its turns in the agent's
        # latency metrics (conversation/parts.py)
        self.tracker = TurnTracker()
        self.parts = build_parts(s, self.tracker, sample_rate=RATE)
        self.stt, self.llm, self.tts = self.parts.stt, self.parts.llm, self.parts.tts
        # AGENT_TOOLS: offered beside the client's, run here (the client never sees a call
        # it must answer); a reply that called them goes on with their results
        self.server_tools = {schema(t)["name"]: t for t in load_tools(s.tools)}
        self._tool_rounds = 0  # consecutive responses that ran server tools
        self.response: Response | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transcribing: set[asyncio.Task[Any]] = set()
        # input audio: at 16 kHz for the VAD and the ear, since the last commit
        self._buffer: list[rtc.AudioFrame] = []
        self._buffer_ms = 0.0  # of those frames (a commit flushes the framer's partial one)
        self._appended_ms = 0.0  # audio appended since the last commit, as the client counts
        self._mic = MicFramer(RATE)  # at the input format's rate (24 kHz pcm16, 8 kHz G.711)
        self._vad: TimedVADStream | None = None
        self._vad_task: asyncio.Task[None] | None = None
        self._speech_item: str | None = None  # the user item server VAD is hearing
        # its speech so far, while the end-of-turn policy waits to see if the user goes on
        self._held: list[rtc.AudioFrame] = []
        self._turn_end: asyncio.Task[None] | None = None
        # the last reply all made, with the item whose audio may still be playing
        self._playing: tuple[Response, dict[str, Any]] | None = None
        self._feed: RecogniserFeed | None = None  # the offline ear, fed as it is heard

    # -- the wire --------------------------------------------------------------------

    def emit(self, ga_name: str, **fields: Any) -> None:
        name = self.dialect.name(ga_name)
        if name is None:
            return
        ev = {"type": name, "event_id": new_id("event"), **fields}
        r = _EMITTING_FOR.get()  # the reply whose task (or its subtask) emits this
        if r is not None and r.held is not None:
            r.held.append(ev)
        else:
            self._put(ev)

    def error(self, e: RealtimeError, event_id: str | None = None) -> None:
        self._put(error_event(e, event_id))

    def _put(self, ev: dict[str, Any]) -> None:
        self.outbox.text(wire_json(ev))

    @property
    def stalled(self) -> bool:
        """The client stopped reading (conversation/outbox.py): the session ends."""
        return self.outbox.stalled

    def start(self) -> None:
        self._restart_vad()
        self.emit("session.created", session=self.session_json())

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
            self.tts.update_options(voice=cfg.voice)
        vad_changed = cfg.turn_detection != self.cfg.turn_detection
        self.cfg = cfg
        if vad_changed:
            self._restart_vad()
        self.emit("session.updated", session=self.session_json())

    def _drop_held_turn(self) -> None:
        """A turn server VAD was holding open is forgotten (the buffer cleared, the VAD
        restarted): its speech is not committed."""
        if self._turn_end is not None:
            self._turn_end.cancel()
        self._held, self._turn_end, self._speech_item = [], None, None

    def _restart_vad(self) -> None:
        self._drop_held_turn()
        if self._vad_task is not None:
            self._vad_task.cancel()
        if self._vad is not None:
            self._spawn(self._vad.aclose())
        self._spawn(self._close_feed())
        self._vad = self._vad_task = None
        td = self.cfg.turn_detection
        if td is None:
            return
        s = self.settings
        # the agent's one Silero model; this session's options on its own stream (each
        # batched stream has its own copy: vad_batch.py; no model loaded per client value)
        stream = self.parts.vad.stream()
        stream.inner.update_options(
            min_silence_duration=(td.silence_duration_ms or s.vad_silence_ms) / 1000,
            activation_threshold=td.threshold or s.vad_activation_threshold)
        self._vad = stream
        self._vad_task = asyncio.create_task(self._vad_events(self._vad), name="rt-vad")

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

    def _mic_frames(self, pcm: np.ndarray) -> list[rtc.AudioFrame]:
        """The mic's audio as the VAD takes it: stamped 16 kHz frames (conversation/mic.py)."""
        if self._mic.input_rate != self._input_rate():  # the input format changed
            self._mic = MicFramer(self._input_rate())
        return self._mic.push(pcm.tobytes())

    async def on_input_audio_buffer_append(self, ev: dict[str, Any]) -> None:
        pcm = self._decode(ev.get("audio"), "audio")
        self._appended_ms += len(pcm) / self._input_rate() * 1000
        for f in self._mic_frames(pcm):
            ms = f.samples_per_channel / VAD_RATE * 1000
            self._buffer.append(f)
            self._buffer_ms += ms
            if self._vad is not None:
                self._vad.push_frame(f)
        if self._buffer_ms > MAX_BUFFER_S * 1000:
            dropped = 0.0
            while self._buffer_ms > MAX_BUFFER_S * 1000:
                f = self._buffer.pop(0)
                d = f.samples_per_channel / VAD_RATE * 1000
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
        frames = self._buffer + self._mic.flush()
        self._clear_buffer()
        now = time.perf_counter()  # the client ended the turn: its commit is the end
        self.tracker.user_turn_ended(SpeechEnd(at=now, decided=now, silence_s=0.0))
        self.tracker.turn_decided(now)
        self._transcribe(self._commit(new_id("item")), frames)

    async def on_input_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        self._drop_held_turn()
        self._mic.flush()
        self._clear_buffer()
        self.emit("input_audio_buffer.cleared")

    def _clear_buffer(self) -> None:
        self._buffer, self._buffer_ms, self._appended_ms = [], 0.0, 0.0

    async def _vad_events(self, stream: TimedVADStream) -> None:
        async for ev in stream:
            td = self.cfg.turn_detection
            if td is None:
                return
            pos = ev.samples_index / VAD_RATE * 1000
            if ev.type == vad.VADEventType.INFERENCE_DONE and ev.speaking:
                if self._feed is not None:
                    self._feed.feed(ev.frames)
                    self._feed.quiet_for(ev.raw_accumulated_silence)
            elif ev.type == vad.VADEventType.START_OF_SPEECH:
                if self._turn_end is not None and not self._turn_end.done():
                    self._turn_end.cancel()  # the user went on: the same turn, held
                    continue
                if self.stt.may_use_sphinx():  # as /v1/talk's ear: fed as the caller speaks
                    await self._close_feed()
                    hangover = (td.silence_duration_ms or self.settings.vad_silence_ms) / 1000
                    self._feed = await RecogniserFeed.open(
                        self.stt, PREPARE_AFTER * hangover if self.stt.early_pass else None)
                    self._feed.feed(ev.frames)
                self._speech_item = new_id("item")
                start = max(0.0, pos - ev.speech_duration * 1000 - td.prefix_padding_ms)
                self.emit("input_audio_buffer.speech_started", audio_start_ms=int(start),
                          item_id=self._speech_item)
                if td.interrupt_response:
                    self._interrupt()
            elif ev.type == vad.VADEventType.END_OF_SPEECH and self._speech_item:
                # the speech ended; the turn ends by the agent's end-of-turn policy
                # (conversation/parts.py), or goes on if the user speaks again meanwhile
                feed, self._feed = self._feed, None
                if self._held and feed is not None:  # it heard only the speech resumed
                    await feed.aclose()
                    feed = None
                self._held += list(ev.frames)
                end = self.tracker.end_of_speech(time.perf_counter(), ev.silence_duration)
                audio_end_ms = int(max(0.0, pos - ev.silence_duration * 1000))
                self._turn_end = self._spawn(self._end_turn(
                    self._speech_item, feed, end, audio_end_ms, td.create_response))

    async def _end_turn(self, item_id: str, feed: RecogniserFeed | None, end: SpeechEnd,
                        audio_end_ms: int, respond: bool) -> None:
        """The held speech's transcript, then the policy's wait: the turn ends (speech
        stopped, committed with its transcript) unless the user speaks again first (this
        task is then cancelled and their speech joins the same item)."""
        frames = list(self._held)
        heard = await self._hear(frames, feed)
        text = heard if isinstance(heard, str) else ""
        td = self.cfg.turn_detection
        wait = await end_of_turn_wait(self.settings, self.parts.turn, text,
                                      td.eagerness if td is not None else None)
        reply = None
        # The reply starts now, during the wait, and is heard the moment the turn ends;
        # not with the agent's own tools, whose results start a follow-up reply that this
        # hold does not cover (that reply starts at the turn's end instead).
        if respond and text and self.response is None and not self.server_tools \
                and self.settings.preemptive_generation:
            reply = self._start_response({}, pending_user=text)
        try:
            # counted from the last speech sample, as the framework's endpointing delay is
            # (the VAD's own silence is part of it)
            await asyncio.sleep(max(0.0, wait - (time.perf_counter() - end.at)))
        except asyncio.CancelledError:  # the user went on: the reply was never theirs
            if reply is not None:
                self._drop(reply)
            raise
        self._held, self._speech_item = [], None
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms,
                  item_id=item_id)
        self._clear_buffer()
        self.tracker.user_turn_ended(end)  # at its last speech sample, as the VAD located it
        self.tracker.turn_decided()
        item = self._commit(item_id)
        self._transcribed(item, frames, heard, respond and reply is None)
        if reply is not None:
            self._release(reply, item)

    def _release(self, r: Response, user_item: dict[str, Any]) -> None:
        """A reply made during the turn's wait goes out: its items after the user's, its
        events in order, its first audio heard from now."""
        for out in r.output:  # made before the user's item was committed
            if out in self.items:
                self.items.remove(out)
                self.items.append(out)
        r.pending_user = None
        held, r.held = r.held or [], None
        for ev in held:
            if ev.get("type") in ("conversation.item.added", "conversation.item.created") \
                    and ev.get("item", {}).get("id") in {o["id"] for o in r.output}:
                ev["previous_item_id"] = user_item["id"]  # the reply answers that item
            self._put(ev)
        if r.audio_ms > 0:
            r.first_audio_at = time.monotonic()
            self.tracker.audio_published()

    def _drop(self, r: Response) -> None:
        """A held reply whose turn went on: cancelled without a word to the client, its
        items gone."""
        def forget(_: object) -> None:
            for out in r.output:
                if out in self.items:
                    self.items.remove(out)
            if self._playing is not None and self._playing[0] is r:
                self._playing = None
        WASTED.labels(part="llm").inc()
        if any(o.get("_tts") is not None for o in r.output):
            WASTED.labels(part="tts").inc()
        if r.task is not None and not r.task.done():
            r.status, r.status_details = "cancelled", {"type": "cancelled",
                                                       "reason": "turn_detected"}
            r.task.cancel()
            r.task.add_done_callback(forget)
        else:
            forget(None)

    async def _hear(self, frames: list[rtc.AudioFrame],
                    feed: RecogniserFeed | None) -> str | Exception:
        """What the ear heard in `frames` (from the recogniser fed during the speech, if
        one was: its final pass already ran in the VAD's hangover), or why it could not."""
        try:
            ev: stt.SpeechEvent = await self.stt.transcribe(
                frames, feed.utt if feed else None, NOT_GIVEN, DEFAULT_API_CONNECT_OPTIONS)
        except Exception as e:  # the ear failed: the item stays, untranscribed
            log.warning("realtime %s: transcription failed: %s", self.id, e)
            return e
        finally:
            if feed is not None:
                await feed.aclose()
        return ev.alternatives[0].text if ev.alternatives else ""

    async def _close_feed(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.aclose()

    def _commit(self, item_id: str) -> dict[str, Any]:
        """The user's audio as an item (its transcript follows: `_transcribed`)."""
        prev = self.items[-1]["id"] if self.items else None
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}]}
        self.items.append(item)
        self.emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item_id)
        self.emit("conversation.item.added", previous_item_id=prev, item=item)
        return item

    def _transcribe(self, item: dict[str, Any], frames: list[rtc.AudioFrame]) -> None:
        """The item's transcript, in the background (a reply waits for it)."""
        async def run() -> None:
            self._transcribed(item, frames, await self._hear(frames, None), respond=False)

        task = self._spawn(run())
        self._transcribing.add(task)
        task.add_done_callback(self._transcribing.discard)

    def _transcribed(self, item: dict[str, Any], frames: list[rtc.AudioFrame],
                     heard: str | Exception, respond: bool) -> None:
        """The item's transcript said (or why there is none); then, on server VAD, a reply
        unless the caller has started speaking again."""
        if isinstance(heard, Exception):
            self.emit("conversation.item.input_audio_transcription.failed",
                      item_id=item["id"], content_index=0,
                      error={"type": "server_error", "code": "transcription_failed",
                             "message": str(heard)[:300]})
            return
        item["content"][0]["transcript"] = heard
        self.emit("conversation.item.input_audio_transcription.completed",
                  item_id=item["id"], content_index=0, transcript=heard, usage={
                      "type": "duration", "seconds": round(sum(f.duration for f in frames), 3)})
        self.emit("conversation.item.done", item=item)
        if respond and self._speech_item is None and self.response is None:
            self._start_response({})

    # -- conversation items ------------------------------------------------------------

    def _find(self, item_id: Any) -> int:
        for i, it in enumerate(self.items):
            if it["id"] == item_id:
                return i
        raise RealtimeError("item_not_found", f"no item {str(item_id)[:80]!r} in the "
                            "conversation", "item_id")

    async def on_conversation_item_create(self, ev: dict[str, Any]) -> None:
        item = self._new_item(ev.get("item"))
        prev = ev.get("previous_item_id")
        if prev is None:
            at = len(self.items)
        elif prev == "root":
            at = 0
        else:
            at = self._find(prev) + 1
        if any(it["id"] == item["id"] for it in self.items):
            raise RealtimeError("duplicate_item_id", f"item {item['id']!r} already exists",
                                "item.id")
        self._check_room(item)
        self.items.insert(at, item)
        prev_id = self.items[at - 1]["id"] if at > 0 else None
        self.emit("conversation.item.added", previous_item_id=prev_id, item=self._item_json(item))
        if item.get("_audio") is not None:  # an input_audio part: transcribed first
            self._transcribe(item, item.pop("_audio"))
        else:
            self.emit("conversation.item.done", item=self._item_json(item))

    def _check_room(self, item: dict[str, Any]) -> None:
        """A client's item fits the session's bounds (MAX_ITEM_CHARS, MAX_ITEMS,
        MAX_CONVERSATION_CHARS), or it is refused and nothing changes."""
        chars = item_chars(item)
        if chars > MAX_ITEM_CHARS:
            raise RealtimeError("invalid_value", f"the item holds {chars:,} characters of "
                                f"text; an item takes at most {MAX_ITEM_CHARS:,}", "item")
        held = sum(map(item_chars, self.items))
        if len(self.items) >= MAX_ITEMS or held + chars > MAX_CONVERSATION_CHARS:
            raise RealtimeError("conversation_too_large", f"the conversation holds "
                                f"{len(self.items)} items and {held:,} characters (at most "
                                f"{MAX_ITEMS} and {MAX_CONVERSATION_CHARS:,}): delete items "
                                "with conversation.item.delete first", "item")

    def _make_room(self) -> None:
        """After a reply: the oldest items go (conversation.item.deleted) while the
        session holds more than its bounds, so a long call stays bounded."""
        held = sum(map(item_chars, self.items))
        while len(self.items) > 1 and (len(self.items) > MAX_ITEMS
                                       or held > MAX_CONVERSATION_CHARS):
            old = self.items.pop(0)
            held -= item_chars(old)
            self.emit("conversation.item.deleted", item_id=old["id"])

    def _new_item(self, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise RealtimeError("invalid_value", "item must be an object", "item")
        kind = raw.get("type", "message")
        item_id = raw.get("id") if isinstance(raw.get("id"), str) else new_id("item")
        base = {"id": item_id, "object": "realtime.item", "status": "completed"}
        if kind == "function_call_output":
            call_id, output = raw.get("call_id"), raw.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise RealtimeError("invalid_value", "a function_call_output needs call_id "
                                    "and output (strings)", "item")
            if not any(it.get("call_id") == call_id and it["type"] == "function_call"
                       for it in self.items):
                raise RealtimeError("invalid_value", f"no function_call with call_id "
                                    f"{call_id[:80]!r} in the conversation", "item.call_id")
            return {**base, "type": kind, "call_id": call_id, "output": output}
        if kind == "function_call":
            fields = [raw.get(k) for k in ("call_id", "name", "arguments")]
            if not all(isinstance(v, str) for v in fields):
                raise RealtimeError("invalid_value", "a function_call needs call_id, name and "
                                    "arguments (strings)", "item")
            return {**base, "type": kind, "call_id": fields[0], "name": fields[1],
                    "arguments": fields[2]}
        if kind != "message":
            raise RealtimeError("invalid_value", "item.type must be message, function_call "
                                f"or function_call_output, not {str(kind)[:40]!r}", "item.type")
        role = raw.get("role")
        if role not in ("user", "assistant", "system"):
            raise RealtimeError("invalid_value", "item.role must be user, assistant or system",
                                "item.role")
        content, audio = [], None
        parts = raw.get("content")
        if not isinstance(parts, list) or not parts:
            raise RealtimeError("invalid_value", "item.content must be a non-empty list",
                                "item.content")
        for i, p in enumerate(parts):
            t = p.get("type") if isinstance(p, dict) else None
            if t in ("input_text", "text", "output_text") and isinstance(p.get("text"), str):
                content.append({"type": t, "text": p["text"]})
            elif t == "input_audio" and role == "user" and audio is None:
                pcm = self._decode(p.get("audio"), f"item.content[{i}].audio")
                clip = MicFramer(self._input_rate())  # a clip, not the mic's clock
                audio = clip.push(pcm.tobytes()) + clip.flush()
                content.append({"type": "input_audio", "transcript": p.get("transcript")})
            else:
                raise RealtimeError("invalid_value", f"item.content[{i}]: a {role} message "
                                    "takes input_text / text parts (and one input_audio for "
                                    "a user)", f"item.content[{i}]")
        item = {**base, "type": "message", "role": role, "content": content}
        if audio is not None and not content[0].get("transcript"):
            item["_audio"] = audio
        return item

    async def on_conversation_item_delete(self, ev: dict[str, Any]) -> None:
        del self.items[self._find(ev.get("item_id"))]
        self.emit("conversation.item.deleted", item_id=ev["item_id"])

    async def on_conversation_item_retrieve(self, ev: dict[str, Any]) -> None:
        item = self.items[self._find(ev.get("item_id"))]
        self.emit("conversation.item.retrieved", item=self._item_json(item))

    async def on_conversation_item_truncate(self, ev: dict[str, Any]) -> None:
        item = self.items[self._find(ev.get("item_id"))]
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
        if r is not None and any(o is item for o in r.output):
            self._cancel_response("client_cancelled")
        self._truncate(item, end)

    def _truncate(self, item: dict[str, Any], end_ms: float) -> None:
        part = item["content"][0]
        full = item.get("_text", part.get("transcript") or "")
        tts = item.get("_tts")  # the TTS stream that spoke it: what it had read, when
        read = tts.chars_at(max(0.0, end_ms / 1000 - AUDIO_LAG_S)) if tts is not None else None
        part["transcript"] = heard_text(full, end_ms, item["_audio_ms"],
                                        item.get("_audio_done", False), read)
        item["_audio_ms"] = min(item["_audio_ms"], end_ms)
        self.emit("conversation.item.truncated", item_id=item["id"], content_index=0,
                  audio_end_ms=int(end_ms))

    def _item_json(self, item: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in item.items() if not k.startswith("_")}
        if self.dialect.beta and out.get("type") == "message":
            out["content"] = [{**p, "type": p["type"].removeprefix("output_")}
                              for p in out["content"]]
        return out

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
        self._start_response(opts)

    async def on_response_cancel(self, ev: dict[str, Any]) -> None:
        r = self.response
        if r is None or (ev.get("response_id") not in (None, r.id)):
            raise RealtimeError("response_cancel_not_active", "there is no active response "
                                "to cancel")
        self._cancel_response("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev: dict[str, Any]) -> None:
        raise RealtimeError("invalid_event", "output_audio_buffer.clear is for WebRTC/SIP; "
                            "over a WebSocket send response.cancel and "
                            "conversation.item.truncate")

    def _start_response(self, opts: dict[str, Any],
                        pending_user: str | None = None) -> Response:
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
        tools = cfg.tools
        if "tools" in opts:
            tools = check_tools(opts["tools"])
        choice = cfg.tool_choice
        if "tool_choice" in opts:
            choice = check_tool_choice(opts["tool_choice"], tools)
        limit = cfg.max_output_tokens
        for key in ("max_output_tokens", "max_response_output_tokens"):
            if key in opts:
                limit = max_tokens(opts[key], f"response.{key}")
        r = Response(
            id=new_id("resp"), modalities=modalities, tools=tools, tool_choice=choice,
            instructions=cfg.instructions if instructions is None else instructions,
            temperature=cfg.temperature, max_tokens=limit, voice=cfg.voice, metadata=metadata,
            held=[] if pending_user is not None else None, pending_user=pending_user)
        self.response = r
        token = _EMITTING_FOR.set(r)  # its events, and its task's (a copy of this context)
        try:
            self.emit("response.created", response=self._response_json(r))
            r.task = self._spawn(self._respond(r))
        finally:
            _EMITTING_FOR.reset(token)
        return r

    def _interrupt(self) -> None:
        """The caller speaks: a reply in progress is cancelled (its item cut when it
        closes); one all made but still playing is cut to what was heard now."""
        if self.response is not None:
            self._cancel_response("turn_detected")
            return
        playing, self._playing = self._playing, None
        if playing is None:
            return
        r, item = playing
        heard = r.heard_ms()
        if heard < item["_audio_ms"] and any(i is item for i in self.items):
            self._truncate(item, heard)

    def _cancel_response(self, reason: str) -> None:
        r = self.response
        if r is None or r.task is None or r.task.done():
            return
        r.status, r.status_details = "cancelled", {"type": "cancelled", "reason": reason}
        r.task.cancel()

    def _sampling(self, r: Response) -> dict[str, Any]:
        """The response's temperature and max tokens, for the thinker call (extra_kwargs)."""
        out: dict[str, Any] = {}
        if r.temperature is not None:
            out["temperature"] = r.temperature
        if r.max_tokens:
            out["max_tokens"] = r.max_tokens
        return out

    def _chat_ctx(self, instructions: str) -> llm.ChatContext:
        ctx = llm.ChatContext.empty()
        if instructions:
            ctx.add_message(role="system", content=instructions)
        names = {it["call_id"]: it["name"] for it in self.items if it["type"] == "function_call"}
        for it in self.items:
            if it["type"] == "function_call":
                ctx.items.append(llm.FunctionCall(call_id=it["call_id"], name=it["name"],
                                                  arguments=it["arguments"]))
            elif it["type"] == "function_call_output":
                ctx.items.append(llm.FunctionCallOutput(
                    call_id=it["call_id"], name=names.get(it["call_id"], ""),
                    output=it["output"], is_error=False))
            else:
                text = " ".join(p.get("text") or p.get("transcript") or ""
                                for p in it["content"]).strip()
                if text:
                    ctx.add_message(role=it["role"], content=text)
        if instructions and not any(getattr(i, "role", "system") != "system" for i in ctx.items):
            # a reply asked for before anyone spoke (a greeting): the thinker answers a
            # conversation, so its instructions are also the first turn
            ctx.add_message(role="user", content=instructions)
        return ctx

    def _tools(self, r: Response) -> tuple[list[llm.Tool], Any]:
        if not (r.tools or self.server_tools) or r.tool_choice == "none":
            return [], None
        tools: list[llm.Tool] = [
            llm.function_tool(_client_side, raw_schema={
                "name": t["name"], "description": t["description"],
                "parameters": t["parameters"]}) for t in r.tools]
        tools += self.server_tools.values()
        choice = r.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        return tools, choice

    async def _respond(self, r: Response) -> None:
        """One response: the thinker's stream as a message (text, and audio through the
        TTS) and function calls, then response.done, whatever ends it."""
        msg: dict[str, Any] | None = None
        ran = False
        tts_stream = None
        audio_task: asyncio.Task[None] | None = None
        llm_stream = None
        try:
            if self._transcribing:  # a reply answers what was said, transcript included
                await asyncio.gather(*list(self._transcribing), return_exceptions=True)
            tools, choice = self._tools(r)
            kw: dict[str, Any] = {"tools": tools} if tools else {}
            if choice is not None and tools:
                kw["tool_choice"] = choice
            ctx = self._chat_ctx(r.instructions)
            if r.pending_user:  # a held turn's words: its item comes when the turn ends
                ctx.add_message(role="user", content=r.pending_user)
            llm_stream = self.llm.chat(chat_ctx=ctx,
                                       extra_kwargs=self._sampling(r), conn_options=ONCE, **kw)
            async for chunk in llm_stream:
                if chunk.usage is not None:
                    r.usage = chunk.usage
                d = chunk.delta
                if d is None:
                    continue
                if d.content:
                    if msg is None:
                        msg = self._open_message(r)
                        if "audio" in r.modalities:
                            tts_stream = msg["_tts"] = self.tts.stream()
                            audio_task = asyncio.create_task(
                                self._forward_audio(r, msg, tts_stream), name="rt-audio")
                    msg["_text"] += d.content
                    if tts_stream is not None:
                        tts_stream.push_text(d.content)  # its captions follow its audio
                    else:
                        self._caption(r, msg, len(msg["_text"]))
                for call in d.tool_calls or []:
                    self._function_call(r, call)
            if tts_stream is not None and audio_task is not None:
                tts_stream.end_input()
                await audio_task
            if msg is not None:
                self._close_message(r, msg)
                msg = None
            ran = await self._run_server_tools(r)
            if r.status == "in_progress" and not r.output and \
                    getattr(llm_stream, "cut_by_length", False):
                # the token limit came before a word or a whole call (a forced call whose
                # arguments never closed): nothing was said, and OpenAI says "incomplete"
                r.status = "incomplete"
                r.status_details = {"type": "incomplete", "reason": "max_output_tokens"}
            r.status = "completed" if r.status == "in_progress" else r.status
        except asyncio.CancelledError:
            if r.status == "in_progress":  # the client went: nothing more is sent
                r.status = "cancelled"
                r.status_details = {"type": "cancelled", "reason": "client_cancelled"}
        except Exception as e:
            log.warning("realtime %s: response %s failed: %s", self.id, r.id, e)
            r.status = "failed"
            r.status_details = {"type": "failed", "error": {
                "type": "server_error", "code": "response_failed", "message": str(e)[:300]}}
        finally:
            if audio_task is not None and not audio_task.done():
                audio_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await audio_task
            for stream in (tts_stream, llm_stream):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            if msg is not None:
                self._close_message(r, msg)
            if self.response is r:
                self.response = None
            self.emit("response.done", response=self._response_json(r))
            self._make_room()
            log.info("realtime %s: response %s %s: %d items, %.0f ms audio", self.id, r.id,
                     r.status, len(r.output), r.audio_ms)
        # the agent's own tools answered: the reply goes on with their results (a model
        # that keeps calling them stops after MAX_TOOL_ROUNDS)
        self._tool_rounds = self._tool_rounds + 1 if ran else 0
        if ran and r.status == "completed" and self.response is None \
                and self._tool_rounds <= MAX_TOOL_ROUNDS:
            self._start_response({"tool_choice": "auto"})

    async def _run_server_tools(self, r: Response) -> bool:
        """The response's calls to AGENT_TOOLS run here, together; each result becomes a
        function_call_output item. A tool still running after AGENT_TOOL_FILLER_AFTER_S
        has the filler spoken (an audio reply) meanwhile. True if any ran."""
        calls = [o for o in r.output if o["type"] == "function_call"
                 and o["name"] in self.server_tools]
        if not calls:
            return False
        said: list[asyncio.Task[None]] = []

        def say(text: str) -> None:
            if not said and "audio" in r.modalities:
                said.append(asyncio.create_task(self._say(r, text), name="rt-filler"))

        results = await asyncio.gather(*(
            run_tool(self.server_tools[c["name"]], c["arguments"], self.settings, say=say)
            for c in calls))
        if said:
            await said[0]
        for call, (output, is_error) in zip(calls, results, strict=True):
            if is_error:
                log.info("realtime %s: tool %s: %s", self.id, call["name"], output[:200])
            item = {"id": new_id("item"), "object": "realtime.item",
                    "type": "function_call_output", "status": "completed",
                    "call_id": call["call_id"], "output": output}
            prev = self.items[-1]["id"] if self.items else None
            self.items.append(item)
            self.emit("conversation.item.added", previous_item_id=prev, item=item)
            self.emit("conversation.item.done", item=item)
        return True

    async def _say(self, r: Response, text: str) -> None:
        """`text` spoken as a message of the response (the filler while a tool runs)."""
        msg = self._open_message(r)
        stream = msg["_tts"] = self.tts.stream()
        try:
            msg["_text"] = text
            stream.push_text(text)
            stream.end_input()
            await self._forward_audio(r, msg, stream)
        finally:
            await stream.aclose()
            self._close_message(r, msg)

    def _open_message(self, r: Response) -> dict[str, Any]:
        audio = "audio" in r.modalities
        part = {"type": "output_audio", "transcript": ""} if audio else \
            {"type": "output_text", "text": ""}
        prev = self.items[-1]["id"] if self.items else None
        msg = {"id": new_id("item"), "object": "realtime.item", "type": "message",
               "role": "assistant", "status": "in_progress", "content": [part], "_text": ""}
        if audio:
            msg["_audio_ms"] = 0.0
        self.items.append(msg)
        r.output.append(msg)
        where = {"response_id": r.id, "output_index": len(r.output) - 1}
        empty = {**part, "type": self.dialect.part(part["type"].removeprefix("output_"))}
        self.emit("response.output_item.added", **where, item=self._item_json(
            {**msg, "content": []}))
        self.emit("conversation.item.added", previous_item_id=prev,
                  item=self._item_json({**msg, "content": []}))
        self.emit("response.content_part.added", **where, item_id=msg["id"], content_index=0,
                  part=empty)
        return msg

    def _where(self, r: Response, item: dict[str, Any]) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": item["id"],
                "output_index": next(i for i, o in enumerate(r.output) if o is item)}

    def _caption(self, r: Response, msg: dict[str, Any], upto: int) -> None:
        """The message's text up to character `upto` (not yet sent) as a delta: a text
        reply's as the thinker writes it, an audio reply's transcript with the audio that
        speaks it (`_forward_audio`)."""
        sent = msg.get("_captioned", 0)
        upto = min(upto, len(msg["_text"]))
        if upto <= sent:
            return
        msg["_captioned"] = upto
        kind = ("response.output_audio_transcript.delta" if "audio" in r.modalities
                else "response.output_text.delta")
        self.emit(kind, **self._where(r, msg), content_index=0, delta=msg["_text"][sent:upto])

    def _spoken(self, msg: dict[str, Any], stream: Any, audio_s: float) -> int:
        """Characters of the message's text that its first `audio_s` of audio speak, to
        the last whole word (as a barge-in cuts it: `heard_text`)."""
        read = stream.chars_at(max(0.0, audio_s - AUDIO_LAG_S))
        return len(heard_text(msg["_text"], audio_s * 1000, math.inf, False, read))

    async def _forward_audio(self, r: Response, msg: dict[str, Any], stream: Any) -> None:
        fmt = self.cfg.output_format
        down = None if fmt == "pcm16" else rtc.AudioResampler(RATE, G711_RATE, num_channels=1)
        where = self._where(r, msg)
        spoken_s = 0.0  # this message's audio sent so far
        async for ev in stream:
            frame: rtc.AudioFrame = ev.frame
            frames = [frame] if down is None else down.push(frame)
            for f in frames:
                pcm = np.frombuffer(f.data.tobytes(), dtype=np.int16)
                data = pcm.tobytes() if down is None else encode_g711(pcm, fmt)
                if not data:
                    continue
                if r.first_audio_at is None and r.held is None:
                    r.first_audio_at = time.monotonic()
                    self.tracker.audio_published()  # the turn's first audio left
                r.audio_ms += f.duration * 1000
                msg["_audio_ms"] = r.audio_ms
                self.emit("response.output_audio.delta", **where, content_index=0,
                          delta=base64.b64encode(data).decode("ascii"))
                spoken_s += f.duration
                self._caption(r, msg, self._spoken(msg, stream, spoken_s))
        r.audio_done = msg["_audio_done"] = True
        self._caption(r, msg, len(msg["_text"]))  # all of it is in the audio sent

    def _close_message(self, r: Response, msg: dict[str, Any]) -> None:
        where = self._where(r, msg)
        audio = "audio" in r.modalities
        if audio and (r.status_details or {}).get("reason") == "turn_detected":
            self._truncate(msg, r.heard_ms())  # the caller heard this much
        part = msg["content"][0]
        if audio:
            if (r.status_details or {}).get("reason") != "turn_detected":
                part["transcript"] = msg["_text"]
            self.emit("response.output_audio.done", **where, content_index=0)
            self.emit("response.output_audio_transcript.done", **where, content_index=0,
                      transcript=part["transcript"])
        else:
            part["text"] = msg["_text"]
            self.emit("response.output_text.done", **where, content_index=0,
                      text=part["text"])
        # closed in the response's course (still in_progress) or at its end
        msg["status"] = "completed" if r.status in ("in_progress", "completed") else "incomplete"
        if audio and msg["status"] == "completed":
            self._playing = (r, msg)
        self.emit("response.content_part.done", **where, content_index=0,
                  part={**part, "type": self.dialect.part(part["type"].removeprefix("output_"))})
        self.emit("response.output_item.done", response_id=r.id,
                  output_index=where["output_index"], item=self._item_json(msg))
        self.emit("conversation.item.done", item=self._item_json(msg))

    def _function_call(self, r: Response, call: llm.FunctionToolCall) -> None:
        prev = self.items[-1]["id"] if self.items else None
        item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call",
                "status": "in_progress", "call_id": call.call_id, "name": call.name,
                "arguments": ""}
        self.items.append(item)
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

    def _response_json(self, r: Response) -> dict[str, Any]:
        u = r.usage
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

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """The client went (or the server stops): every response, transcription and the
        VAD stop here, so no thinker or TTS work outlives the session."""
        self._cancel_response("client_cancelled")
        tasks = [t for t in (*self._tasks, self._vad_task) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._vad is not None:
            with contextlib.suppress(Exception):
                await self._vad.aclose()
        await self._close_feed()
        await self.parts.aclose()
        self.outbox.close()


def item_chars(item: dict[str, Any]) -> int:
    """The text an item holds: its parts' text and transcripts, a call's arguments and
    output (what the thinker is sent, and what the session keeps)."""
    n = sum(len(p.get("text") or p.get("transcript") or "") for p in item.get("content", ()))
    # a reply's message: its text as made (`_text`), which its transcript repeats
    return max(n, len(item.get("_text", ""))) + len(item.get("arguments", "")) \
        + len(item.get("output", ""))


_EMITTING_FOR: contextvars.ContextVar[Response | None] = contextvars.ContextVar(
    "realtime_response", default=None)


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (RFC 8259): Python's parser takes them, and echoed
    back (a response's metadata) they broke a browser's JSON.parse."""
    raise ValueError(f"{name} is not a JSON value")


async def _client_side(**_: Any) -> None:
    """A tool the Realtime client runs: the agent never calls it (it sends the call)."""
    raise RuntimeError("client-side tool called on the server")
