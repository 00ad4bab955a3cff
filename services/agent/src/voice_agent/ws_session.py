"""WebSocket transport: one conversation per connection, no LiveKit (`GET /v1/talk`).

The agent's HTTP server (AGENT_HTTP_PORT) serves it in `serve-direct` (the local mesh)
and in the worker mode. Each connection runs the same pipeline as the direct mode
(`build_pipeline` + `attach_duplex`: plugins, Silero VAD, duplex controller, fallback,
transcript synchronizer) with `SocketInput` / `SocketOutput` in place of room tracks.

Protocol (v1). Text messages are JSON objects with a "type"; binary messages are PCM.
  client -> server
    {"type": "start", "sample_rate": 48000,    first message, exactly once; the rate of
     "voice": "alice"}                         the mic PCM that follows (INPUT_RATES);
                                               `voice` (optional): the agent's voice for
                                               this call, a name from GET /v1/voices (the
                                               TTS's presets and library voices); absent:
                                               AGENT_TTS_VOICE
    binary: s16le mono mic PCM at that rate, any length up to MAX_MESSAGE_MS, in real time
    {"type": "stop"}                           end the conversation (or just close)
  server -> client
    {"type": "ready", "protocol": 1, "session_id", "input_rate", "output_rate": 24000,
     "frame_ms": 20, "encoding": "s16le", "voice"}
    binary: s16le mono reply PCM at output_rate, one frame_ms frame a message, paced in
            real time (the client keeps a small jitter buffer)
    {"type": "state", "state": "listening"|"thinking"|"speaking"|"paused"|"interrupting"}
    {"type": "transcript", "role": "user"|"assistant", "text", "interrupted"}
    {"type": "latency", "trace_id", "eot_to_first_audio_ms", "llm_ttft_ms", "tts_ttfa_ms"}
            (the record the worker publishes on the "latency" data topic)
    {"type": "clear"}   barge-in: no more audio of this reply; drop what is buffered
    {"type": "error", "code", "message"}, then the server closes the socket
Close codes: 1000 normal, 1001 server going away, 1003 binary before "start",
1007 text that is not a JSON message, 1008 other protocol errors (an unknown voice:
code "unknown_voice", naming the TTS's voices), 1009 message too large, 1011
internal error, 1013 at capacity (AGENT_WS_MAX_SESSIONS) or overloaded (the process
runs late: AGENT_ADMIT_MAX_LAG_MS, load.py); try again later.

Not here: authentication (bind AGENT_HTTP_HOST to loopback or put an authenticating
proxy in front), and any knowledge of the page that uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web
from livekit import rtc
from livekit.agents.utils.audio import AudioByteStream
from livekit.agents.voice import io
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer
from prometheus_client import Counter, Gauge
from voice_keys import ApiKeys, bearer

from .agent import PhraseCache, attach_duplex, build_pipeline, starter_phrases
from .audio_io import PacedOutput
from .duplex import DuplexState
from .load import MONITOR
from .metrics import REGISTRY, TurnTracker
from .plugins import TTS
from .settings import AgentSettings
from .speech_end import stamp
from .voices import (
    NAME,
    VoicesUnavailable,
    check_configured_voice,
    find,
    list_voices,
    not_found_message,
)

log = logging.getLogger("voice_agent.ws")

PATH = "/v1/talk"
VOICES_PATH = "/v1/voices"  # GET: the TTS's voices a conversation may ask for (TalkHub.voices)
PROTOCOL = 1
INPUT_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
VAD_RATE = 16000  # what the VAD and the STT take
MAX_MESSAGE_MS = 500  # audio in one binary message (browsers send 3-100 ms)
HELLO_TIMEOUT_S = 10.0
LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")  # one host, whichever name a page uses
MAX_BACKLOG_S = 5.0  # mic audio the session may lag behind the client (older is dropped)
MAX_AHEAD_S = 5.0  # mic audio a client may send ahead of real time (else: too_fast)
CLOCK_WINDOW_S = 2.0  # how long a mic's audio clock is followed (SocketInput._sent_at)
PREPARE_TIMEOUT_S = 120.0  # the starter phrases: retried until the TTS answers, this long
PREPARE_RETRY_S = 2.0
MAX_OUTBOX_S = 10.0  # reply audio waiting for a client that does not read
MAX_VOICE_CACHES = 32  # voices whose starter phrases are kept (the default's always)

SESSIONS = Gauge("agent_ws_sessions", "/v1/talk conversations under way (started, not ended)",
                 registry=REGISTRY)
REFUSED = Counter("agent_ws_refused_total", "/v1/talk connections refused, by reason",
                  ["reason"], registry=REGISTRY)
for _reason in ("busy", "overloaded"):  # exported at 0 before the first refusal
    REFUSED.labels(reason=_reason)
MIC_DROPPED = Counter("agent_mic_frames_dropped_total",
                      "Mic frames dropped because the conversation fell behind reading them "
                      f"(over {MAX_BACKLOG_S:.0f} s queued): the agent was busy, not the "
                      "client too fast", registry=REGISTRY)


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, close_code: int = 1008,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.close_code = code, message, close_code
        self.reason = reason or code  # agent_ws_refused_total's label


def parse_start(text: str) -> tuple[int, str | None]:
    """The client's first message -> its mic sample rate and the voice it asks for, if
    any (ProtocolError if bad; whether the TTS has that voice is the hub's question)."""
    msg = parse_json(text)
    if msg.get("type") != "start":
        raise ProtocolError("expected_start", f'the first message must be {{"type": "start", '
                            f'"sample_rate": N}}, got type {msg.get("type")!r}')
    rate = msg.get("sample_rate")
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in INPUT_RATES:
        raise ProtocolError("bad_sample_rate", f"sample_rate {rate!r} is not supported; "
                            f"use one of {list(INPUT_RATES)} (s16le mono)")
    voice = msg.get("voice")
    if voice is None or voice == "":
        return rate, None
    if not isinstance(voice, str) or not NAME.fullmatch(voice):
        raise ProtocolError("bad_voice", f"voice {str(voice)[:80]!r} is not a voice name "
                            "([A-Za-z0-9_-]{1,64}; GET /v1/voices lists them)")
    return rate, voice


def parse_json(text: str) -> dict[str, object]:
    try:
        msg = json.loads(text)
    except RecursionError:  # nested thousands deep: no message of ours nests past 1
        raise ProtocolError("bad_json", "JSON nested too deep", 1007) from None
    except ValueError:
        raise ProtocolError("bad_json", "text messages must be JSON objects", 1007) from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_json", "text messages must be JSON objects", 1007)
    return msg


class Outbox:
    """What goes to the client, in order: JSON events and PCM frames, sent by one task.
    `drop_audio()` removes frames not yet sent (barge-in). A frame may carry a call made
    with the moment it was written to the socket (a reply's first frame: its latency)."""

    def __init__(self, ws: web.WebSocketResponse, frame_s: float) -> None:
        self._ws = ws
        self._items: deque[str | bytes | tuple[bytes, Callable[[float], None]]] = deque()
        self._ready = asyncio.Event()
        self._audio = 0
        self._max_audio = int(MAX_OUTBOX_S / frame_s)
        self.audio_sent = 0
        self.stalled = False  # the client stopped reading: the sender gives up

    def event(self, **msg: object) -> None:
        self._items.append(json.dumps(msg, ensure_ascii=False))
        self._ready.set()

    def audio(self, pcm: bytes, on_sent: Callable[[float], None] | None = None) -> None:
        if self._audio >= self._max_audio:
            self.stalled = True
        self._items.append(pcm if on_sent is None else (pcm, on_sent))
        self._audio += 1
        self._ready.set()

    def drop_audio(self) -> None:
        self._items = deque(x for x in self._items if isinstance(x, str))
        self._audio = 0

    async def run(self) -> None:
        """Send until cancelled; returns when the client is gone."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._items:
                item = self._items.popleft()
                if self._ws.closed or self.stalled:
                    return
                try:
                    if isinstance(item, str):
                        await self._ws.send_str(item)
                        continue
                    pcm, on_sent = item if isinstance(item, tuple) else (item, None)
                    self._audio -= 1
                    await self._ws.send_bytes(pcm)
                    self.audio_sent += 1
                    if on_sent is not None:
                        on_sent(time.perf_counter())
                except (ConnectionError, RuntimeError):
                    return


class SocketInput(io.AudioInput):
    """The client's mic: PCM at its rate -> 20 ms frames at 16 kHz, as they arrive.

    Two limits, two causes. A client that sends audio faster than real time (more than
    MAX_AHEAD_S ahead of the clock since its first message) is refused: `too_fast`. A
    conversation that falls behind reading (its pipeline busy: starting, or an overloaded
    host) keeps the newest MAX_BACKLOG_S and drops the oldest, with a log line and
    `agent_mic_frames_dropped_total`: the call goes on.

    Each frame is stamped with when its samples were sent (speech_end.stamp), on the
    client's audio clock: a mic sends its audio in real time, so the message whose audio
    ends at position p was sent at p + the smallest (arrival - position) of the last
    CLOCK_WINDOW_S. A message read late (this loop was busy) keeps the time it was sent;
    one that arrived on time keeps its arrival."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        super().__init__(label="SocketInput")
        self._resampler = (rtc.AudioResampler(input_rate=input_rate, output_rate=VAD_RATE,
                                              num_channels=1)
                           if input_rate != VAD_RATE else None)
        self._input_rate = input_rate
        self._framer = AudioByteStream(VAD_RATE, 1, samples_per_channel=VAD_RATE * frame_ms // 1000)
        self._queue: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue(
            maxsize=int(MAX_BACKLOG_S * 1000 / frame_ms))
        self._t0: float | None = None  # monotonic time of the first audio
        self._received_s = 0.0  # audio received, seconds
        self._unframed: deque[list[float]] = deque()  # [16 kHz samples, perf time sent]
        self._offsets: deque[tuple[float, float]] = deque()  # (arrived, arrived - position)
        self.dropped = 0  # frames dropped since the last log line

    def push(self, pcm: bytes) -> None:
        now = time.monotonic()
        arrived = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self._received_s += len(pcm) / 2 / self._input_rate
        if self._received_s - (now - self._t0) > MAX_AHEAD_S:
            raise ProtocolError("too_fast", "mic audio arrives faster than real time "
                                f"(over {MAX_AHEAD_S:.0f} s ahead of the clock)")
        sent = self._sent_at(arrived)
        if self._resampler is not None:
            frame = rtc.AudioFrame(data=pcm, sample_rate=self._input_rate, num_channels=1,
                                   samples_per_channel=len(pcm) // 2)
            pcm = b"".join(bytes(f.data) for f in self._resampler.push(frame))
        if pcm:
            self._unframed.append([len(pcm) // 2, sent])
        for f in self._framer.push(pcm):
            stamp(f, self._arrivals(f.samples_per_channel))
            if self._queue.full():  # the conversation is behind: the oldest goes
                self._queue.get_nowait()
                MIC_DROPPED.inc()
                if not self.dropped:
                    log.warning("the conversation fell behind reading the mic (over %.0f s "
                                "queued: the agent is busy); dropping its oldest audio",
                                MAX_BACKLOG_S)
                self.dropped += 1
            elif self.dropped:
                log.info("the conversation caught up; %d mic frames (%d ms) were dropped",
                         self.dropped, self.dropped * 20)
                self.dropped = 0
            self._queue.put_nowait(f)

    def _sent_at(self, arrived: float) -> float:
        """When the message just received (its audio ends at `_received_s`) was sent: its
        position on the client's real-time audio clock (a sliding-window minimum)."""
        offset = arrived - self._received_s
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((arrived, offset))
        while self._offsets[0][0] < arrived - CLOCK_WINDOW_S:
            self._offsets.popleft()
        return self._received_s + self._offsets[0][1]

    def _arrivals(self, n: int) -> list[tuple[int, float]]:
        """When the next `n` samples were sent (speech_end.stamp): runs by message."""
        out: list[tuple[int, float]] = []
        done = 0
        while done < n and self._unframed:
            run = self._unframed[0]
            take = min(int(run[0]), n - done)
            done += take
            run[0] -= take
            out.append((done, run[1]))
            if not run[0]:
                self._unframed.popleft()
        return out

    def close(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    async def __anext__(self) -> rtc.AudioFrame:
        frame = await self._queue.get()
        if frame is None:
            self._queue.put_nowait(None)  # stays closed for any later reader
            raise StopAsyncIteration
        return frame


class SocketOutput(PacedOutput):
    """The client's loudspeaker, seen from here: the paced ticks of agent audio go out
    as they leave (the client plays as it receives); a clear drops what is queued for
    the socket and tells the client to flush its playout buffer. A reply's first audio
    is when its first frame was written to the socket (`on_first_audio`): a loop busy
    between the tick and the write delays what the caller hears."""

    def __init__(self, outbox: Outbox, *, sample_rate: int, frame_ms: int,
                 on_first_audio: Callable[[float], None]) -> None:
        super().__init__("SocketOutput", sample_rate=sample_rate, frame_ms=frame_ms,
                         on_first_audio=self._first_tick)
        self._outbox = outbox
        self._on_first_sent = on_first_audio
        self._first = False
        self._last_audible = float("-inf")

    def _first_tick(self, at: float) -> None:
        self._first = True

    def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
        if audible:
            first, self._first = self._first, False
            self._outbox.audio(chunk.ljust(self.frame_samples * 2, b"\0"),
                               self._on_first_sent if first else None)
            self._last_audible = at

    def _cleared(self, at: float) -> None:
        self._outbox.drop_audio()
        self._outbox.event(type="clear")

    def silent_from(self, t: float) -> float:
        """When the client stopped being sent audio, for a barge-in decided at `t`."""
        if self._last_audible < t - self._frame_s:
            return t
        return max(t, self._last_audible + self._frame_s)


class TalkSession:
    """One conversation on one socket: the pipeline, its I/O and its events."""

    def __init__(self, settings: AgentSettings, cache: PhraseCache,
                 ws: web.WebSocketResponse, input_rate: int) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.settings = settings  # its tts_voice: this conversation's voice
        self.ws = ws
        self.outbox = Outbox(ws, settings.tts_frame_ms / 1000)
        tracker = TurnTracker(on_report=lambda rec: self.outbox.event(type="latency", **rec))
        self.pipeline = p = build_pipeline(settings, tracker=tracker, cache=cache)
        self.mic = SocketInput(input_rate)
        self.speaker = SocketOutput(self.outbox, sample_rate=settings.tts_sample_rate,
                                    frame_ms=settings.tts_frame_ms,
                                    on_first_audio=tracker.audio_published)
        self._sync = TranscriptSynchronizer(next_in_chain_audio=self.speaker,
                                            next_in_chain_text=None)
        # the reply's first audio is the socket's to report (SocketOutput)
        duplex = attach_duplex(p, silent_from=self.speaker.silent_from,
                               reports_first_audio=False)
        duplex.on_state(lambda s: self.outbox.event(type="state", state=s.value))
        p.session.on("conversation_item_added", self._on_item)
        self.outbox.event(type="ready", protocol=PROTOCOL, session_id=self.id,
                          input_rate=input_rate, output_rate=settings.tts_sample_rate,
                          frame_ms=settings.tts_frame_ms, encoding="s16le",
                          voice=settings.tts_voice)
        self.outbox.event(type="state", state=DuplexState.LISTENING.value)

    def _on_item(self, ev: object) -> None:
        item = getattr(ev, "item", None)
        if getattr(item, "type", None) != "message" or item.role not in ("user", "assistant"):
            return
        self.outbox.event(type="transcript", role=item.role, text=item.text_content or "",
                          interrupted=bool(item.interrupted))

    async def run(self, on_end: Callable[[], None] = lambda: None) -> None:
        """Until the client stops or goes, or a protocol error (raised after teardown).
        `on_end` runs as soon as either side has ended it, before the teardown."""
        p = self.pipeline
        sender = asyncio.create_task(self.outbox.run(), name=f"talk-{self.id}-send")
        receiver = asyncio.create_task(self._receive(), name=f"talk-{self.id}-recv")
        try:  # listening at once: the starter phrases are the hub's (`TalkHub.prepare`)
            p.session.input.audio = self.mic
            p.session.output.audio = self._sync.audio_output
            p.session.output.transcription = self._sync.text_output
            self.speaker.start()
            await p.session.start(agent=p.agent, record=False)
            # either side ending ends the conversation
            await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
            if (receiver.done() and not receiver.cancelled()
                    and isinstance(err := receiver.exception(), ProtocolError)):
                await _refuse(self.ws, err)  # the client hears why now, not after teardown
        finally:
            on_end()  # the slot is free now; the teardown takes a moment more
            receiver.cancel()
            await self._teardown()
            sender.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)
        if not receiver.cancelled() and (err := receiver.exception()) is not None:
            raise err

    async def _receive(self) -> None:
        async for msg in self.ws:
            if msg.type == WSMsgType.BINARY:
                check_audio(msg.data, self.mic._input_rate)
                self.mic.push(msg.data)
            elif msg.type == WSMsgType.TEXT:
                kind = parse_json(msg.data).get("type")
                if kind == "stop":
                    return
                if kind == "start":
                    raise ProtocolError("duplicate_start", '"start" was already received')
                raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
            elif msg.type == WSMsgType.ERROR:
                raise ProtocolError("too_large", str(self.ws.exception()), 1009)

    async def _teardown(self) -> None:
        self.mic.close()
        p = self.pipeline
        try:
            await p.session.aclose()
        finally:
            await self._sync.aclose()  # its segment tasks outlive the session otherwise
            await self.speaker.aclose()
            for comp in (p.stt, p.llm, p.tts):
                await comp.aclose()


def check_audio(data: bytes, rate: int) -> None:
    if len(data) % 2:
        raise ProtocolError("bad_audio", "binary messages are s16le PCM: an even byte count")
    limit = rate * MAX_MESSAGE_MS // 1000 * 2
    if len(data) > limit:
        raise ProtocolError("too_large", f"binary message of {len(data)} bytes: at most "
                            f"{MAX_MESSAGE_MS} ms of audio ({limit} bytes at {rate} Hz)", 1009)


class TalkHub:
    """The route: admission (AGENT_WS_MAX_SESSIONS, and none while the process runs
    late: AGENT_ADMIT_MAX_LAG_MS), the hello, one TalkSession each.

    Before its first conversation the hub prepares what every conversation shares
    (`prepare`, started with the HTTP server; /healthz answers 503 until it is done):
    the starter phrases synthesized once (the greeting plays from memory, and the
    fallback plays even when the TTS is down), the recogniser's process, the VAD. A
    conversation never waits for it: one that starts earlier speaks its greeting live."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.cache = PhraseCache()  # one per process: the greeting is the same for all
        self.sockets: set[web.WebSocketResponse] = set()  # open, started or not
        self.talking = 0  # conversations under way: the slots taken
        # Sockets waiting for `start` cost little but are bounded too (a slow hello is
        # cut at HELLO_TIMEOUT_S); conversations are counted apart, from `start`.
        self.max_open = 4 * settings.ws_max_sessions + 16
        self.keys = ApiKeys(settings.api_keys.get_secret_value(), settings.api_keys_file,
                            file_setting="AGENT_API_KEYS_FILE",
                            how="send `Authorization: Bearer <key>`, or ?api_key=<key> "
                            "from a browser")
        self.ready = asyncio.Event()  # prepared (or given up on: see the log)
        self._prepare: asyncio.Task[None] | None = None
        # the starter phrases in each voice conversations asked for (key: lower-case
        # name): the default's is `cache`; another's is warmed at its first conversation
        self.caches: dict[str, PhraseCache] = {settings.tts_voice.lower(): self.cache}
        self._warming: set[asyncio.Task[None]] = set()

    async def start(self, _app: web.Application | None = None) -> None:
        self._prepare = asyncio.create_task(self.prepare(), name="talk-prepare")

    async def prepare(self) -> None:
        s = self.settings
        t0 = time.perf_counter()
        p = build_pipeline(s, cache=self.cache)  # the VAD and the shared recogniser too
        try:
            await p.stt.prewarm_async()
            phrases = starter_phrases(s) if s.starter_cache else []
            voice_ok: bool | None = None  # AGENT_TTS_VOICE on the TTS (None: not asked)
            while True:
                await self.cache.warm(p.tts, phrases, timeout_s=30.0)
                missing = [x for x in phrases if not self.cache.has(x)]
                if voice_ok is None:  # logs an error naming the fix if it is not there
                    voice_ok = await check_configured_voice(s, quiet_unavailable=True)
                done = not missing and voice_ok is not None
                if done or voice_ok is False or time.perf_counter() - t0 > PREPARE_TIMEOUT_S:
                    break
                await asyncio.sleep(PREPARE_RETRY_S)  # the TTS may still be starting
            if voice_ok is None:
                log.warning("AGENT_TTS_VOICE=%r not checked: the TTS at %s did not list its "
                            "voices", s.tts_voice, s.tts_addr)
            if missing:
                log.warning("talk: starter phrases %s not synthesized in %.0f s (is the TTS "
                            "at %s up?): conversations speak them live", missing,
                            PREPARE_TIMEOUT_S, s.tts_addr)
            log.info("talk: ready in %.1f s (%d starter phrases cached)",
                     time.perf_counter() - t0, len(phrases) - len(missing))
        except Exception:
            log.exception("talk: preparing failed; conversations start unprepared")
        finally:
            self.ready.set()
            for comp in (p.stt, p.llm, p.tts):
                await comp.aclose()

    def origin_allowed(self, request: web.Request) -> bool:
        """A browser's page may talk from the agent's own host (any port: the mesh's page
        is served by the token service next door) or from AGENT_WS_ORIGINS; a page on
        another site may not drive a visitor's browser into the agent. No Origin: not a
        browser (the key, if any, guards those)."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        origin = origin.rstrip("/").lower()
        allowed = {o.strip().rstrip("/").lower() for o in self.settings.ws_origins.split(",")}
        host, ours = urlsplit(origin).hostname, (request.url.host or "").lower()
        return "*" in allowed or origin in allowed or (
            host is not None and (host == ours or (host in LOOPBACK and ours in LOOPBACK)))

    async def voices(self, request: web.Request) -> web.Response:
        """GET /v1/voices: the voices a conversation may ask for (the TTS's ListVoices:
        presets and library voices, with their kind) and the agent's default. For the
        page (a fetch from the same origins /v1/talk allows, with the same key)."""
        cors = ({"Access-Control-Allow-Origin": request.headers["Origin"], "Vary": "Origin"}
                if "Origin" in request.headers and self.origin_allowed(request) else {})
        key = bearer(request.headers.get("Authorization")) or request.query.get("api_key")
        if not self.keys.allows(key):
            return web.json_response(
                {"type": "error", "code": "unauthorized", "message": self.keys.refusal(key)},
                status=401, headers={"WWW-Authenticate": "Bearer", **cors})
        try:
            voices = await list_voices(self.settings)
        except VoicesUnavailable as e:
            return web.json_response({"type": "error", "code": "tts_unavailable",
                                      "message": str(e)}, status=503, headers=cors)
        default = find(voices, self.settings.tts_voice)
        return web.json_response(
            {"voices": [v.as_json() for v in voices],
             "default": default.name if default else self.settings.tts_voice,
             "default_found": default is not None}, headers=cors)

    async def session_voice(self, requested: str | None) -> tuple[AgentSettings, PhraseCache]:
        """The settings and phrase cache of a conversation that asked for `requested`
        (None: AGENT_TTS_VOICE). A voice the TTS does not list is refused (unknown_voice);
        when the TTS does not answer, the name goes through as asked (its replies fail
        as any reply does while the TTS is down)."""
        s = self.settings
        if requested is None or requested.lower() == s.tts_voice.lower():
            return s, self.cache
        try:
            voices = await list_voices(s)
        except VoicesUnavailable as e:
            log.warning("talk: voice %r not checked: %s", requested, e)
            name = requested
        else:
            voice = find(voices, requested)
            if voice is None:
                raise ProtocolError("unknown_voice", not_found_message(requested, voices,
                                                                       s.tts_addr))
            name = voice.name
        return s.model_copy(update={"tts_voice": name}), self._cache_for(name)

    def _cache_for(self, voice: str) -> PhraseCache:
        cache = self.caches.get(voice.lower())
        if cache is not None:
            return cache
        if len(self.caches) >= MAX_VOICE_CACHES or not self.settings.starter_cache:
            return PhraseCache()  # spoken live
        cache = self.caches[voice.lower()] = PhraseCache()
        task = asyncio.create_task(self._warm(voice, cache), name=f"talk-warm-{voice}")
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)
        return cache

    async def _warm(self, voice: str, cache: PhraseCache) -> None:
        """The starter phrases in `voice`, for its next conversations (this one speaks
        them live if they are not ready in time)."""
        s = self.settings
        tts = TTS(addr=s.tts_addr, voice=voice, language=s.tts_language,
                  sample_rate=s.tts_sample_rate, frame_ms=s.tts_frame_ms, seed=s.tts_seed,
                  max_frames=s.tts_max_frames, api_key=s.tts_api_key.get_secret_value())
        try:
            await cache.warm(tts, starter_phrases(s), timeout_s=30.0)
        finally:
            await tts.aclose()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.origin_allowed(request):
            REFUSED.labels(reason="origin").inc()
            return web.json_response(
                {"type": "error", "code": "origin_not_allowed", "message":
                 f"origin {request.headers['Origin'][:100]!r} may not open /v1/talk (the "
                 "agent's own host, or AGENT_WS_ORIGINS)"}, status=403)
        key = bearer(request.headers.get("Authorization")) or request.query.get("api_key")
        if not self.keys.allows(key):  # before the upgrade: no socket, no slot
            REFUSED.labels(reason="unauthorized").inc()
            return web.json_response(
                {"type": "error", "code": "unauthorized", "message": self.keys.refusal(key)},
                status=401, headers={"WWW-Authenticate": "Bearer"})
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4 * 48000 * MAX_MESSAGE_MS // 1000)
        await ws.prepare(request)
        if len(self.sockets) >= self.max_open:
            REFUSED.labels(reason="busy").inc()
            await _refuse(ws, ProtocolError(
                "busy", f"too many connections ({self.max_open}) are open or waiting to "
                "start; try again later", 1013))
            return ws
        self.sockets.add(ws)
        t0 = time.perf_counter()
        session: TalkSession | None = None
        release: Callable[[], None] | None = None
        try:
            rate, voice = await self._hello(ws)
            settings, cache = await self.session_voice(voice)
            release = self._take_slot()
            session = TalkSession(settings, cache, ws, rate)
            log.info("talk %s: start, mic %d Hz, voice %s, from %s", session.id, rate,
                     settings.tts_voice, request.remote)
            await session.run(on_end=release)
            await ws.close()
        except ConnectionResetError:
            log.info("talk: client left before starting")
        except ProtocolError as e:
            REFUSED.labels(reason=e.reason).inc()
            log.info("talk %s: %s: %s", session.id if session else "-", e.code, e.message)
            await _refuse(ws, e)
        except Exception:
            log.exception("talk %s failed", session.id if session else "-")
            await _refuse(ws, ProtocolError("internal", "internal error in the agent", 1011))
        finally:
            self.sockets.discard(ws)
            if release is not None:
                release()
            if session is not None:
                log.info("talk %s: end after %.1f s, %d frames sent", session.id,
                         time.perf_counter() - t0, session.outbox.audio_sent)
        return ws

    def _take_slot(self) -> Callable[[], None]:
        """A conversation slot (AGENT_WS_MAX_SESSIONS), taken at `start`: a socket that
        never starts holds none. The returned call gives it back, once."""
        if self.talking >= self.settings.ws_max_sessions:
            raise ProtocolError(
                "busy", f"the agent is at capacity ({self.settings.ws_max_sessions} "
                "conversations, AGENT_WS_MAX_SESSIONS); try again later", 1013)
        limit = self.settings.admit_max_lag_ms
        # An idle process always takes one: its lateness is not its conversations' (a
        # busy shared host, e.g. the 2-core mesh), and refusing would serve nobody.
        if self.talking > 0 and MONITOR.overloaded(limit):
            raise ProtocolError(
                "busy", f"the agent's host is overloaded: it runs {MONITOR.lag_s() * 1000:.0f} "
                f"ms late (over AGENT_ADMIT_MAX_LAG_MS={limit}), so another conversation "
                f"would break up every reply ({self.talking} under way); try again later",
                1013, reason="overloaded")
        self.talking += 1
        SESSIONS.inc()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.talking -= 1
                SESSIONS.dec()

        return release

    async def _hello(self, ws: web.WebSocketResponse) -> tuple[int, str | None]:
        try:
            msg = await ws.receive(timeout=HELLO_TIMEOUT_S)
        except TimeoutError:
            raise ProtocolError("no_start", f'no "start" message within {HELLO_TIMEOUT_S:.0f} '
                                "s") from None
        if msg.type == WSMsgType.BINARY:
            raise ProtocolError("expected_start", 'binary audio before the "start" message',
                                1003)
        if msg.type == WSMsgType.TEXT:
            return parse_start(msg.data)
        if msg.type == WSMsgType.ERROR:
            raise ProtocolError("too_large", str(ws.exception()), 1009)
        raise ConnectionResetError("client left before starting")

    async def close_all(self, _app: web.Application | None = None) -> None:
        """On shutdown: every conversation ends with 1001 (going away)."""
        if self._prepare is not None:
            self._prepare.cancel()
        for task in list(self._warming):
            task.cancel()
        for ws in list(self.sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=1001, message=b"agent shutting down")


TALK_HUB = web.AppKey("talk_hub", TalkHub)


async def _refuse(ws: web.WebSocketResponse, e: ProtocolError) -> None:
    if ws.closed:
        return
    with contextlib.suppress(Exception):
        await ws.send_str(json.dumps({"type": "error", "code": e.code, "message": e.message}))
        await ws.close(code=e.close_code, message=e.code.encode())
