"""The `/v1/talk` route (`TalkHub`): the door (conversation/door.py: origin, API key,
open sockets, slots, load), the hello, the voice a conversation asks for and its starter
phrases, the feedback folder its conversations share (feedback.py), one TalkSession
each; and GET /v1/voices.

What a conversation does once started is session.py's; the messages are protocol.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import WSMsgType, web
from voice_keys import bearer

from ..agent import PhraseCache, build_pipeline, starter_phrases
from ..conversation.door import REFUSED, Door, Refused
from ..feedback import FeedbackRecorder
from ..plugins import TTS
from ..settings import AgentSettings
from ..voices import (
    UnknownVoice,
    VoicesUnavailable,
    check_configured_voice,
    find,
    list_voices,
    resolve,
)
from .protocol import (
    HELLO_TIMEOUT_S,
    MAX_MESSAGE_MS,
    Close,
    ProtocolError,
    error_event,
    parse_start,
)
from .session import TalkSession, refuse

log = logging.getLogger("voice_agent.ws")

PREPARE_TIMEOUT_S = 120.0  # the starter phrases: retried until the TTS answers, this long
PREPARE_RETRY_S = 2.0
MAX_VOICE_CACHES = 32  # voices whose starter phrases are kept (the default's always)



def protocol_error(e: Refused) -> ProtocolError:
    """A refusal of the door in this protocol's words (after the upgrade)."""
    return ProtocolError(e.code, e.message, e.close_code, reason=e.reason)


class TalkHub:
    """The route: the door (shared with /v1/realtime), the hello, one TalkSession each.

    Before its first conversation the hub prepares what every conversation shares
    (`prepare`, started with the HTTP server; /healthz answers 503 until it is done):
    the starter phrases synthesized once (the greeting plays from memory, and the
    fallback plays even when the TTS is down), the recogniser's process, the VAD. A
    conversation never waits for it: one that starts earlier speaks its greeting live."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.cache = PhraseCache()  # one per process: the greeting is the same for all
        self.door = Door(settings)  # a slow hello is cut at HELLO_TIMEOUT_S
        # AGENT_FEEDBACK_DIR: a folder that cannot be made fails the start (ValueError)
        self.recorder = FeedbackRecorder(settings.feedback_dir, settings.feedback_max_mb)
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
            log.info("talk: ready in %.1f s (%d starter phrases cached); stt: %s",
                     time.perf_counter() - t0, len(phrases) - len(missing), p.stt.describe())
        except Exception:
            log.exception("talk: preparing failed; conversations start unprepared")
        finally:
            self.ready.set()
            for comp in (p.stt, p.llm, p.tts):
                await comp.aclose()

    @property
    def sockets(self) -> set[web.WebSocketResponse]:
        return self.door.sockets

    @property
    def talking(self) -> int:
        return self.door.talking

    async def voices(self, request: web.Request) -> web.Response:
        """GET /v1/voices: the voices a conversation may ask for (the TTS's ListVoices:
        presets and library voices, with their kind) and the agent's default. For the
        page (a fetch from the same origins /v1/talk allows, with the same key)."""
        cors = ({"Access-Control-Allow-Origin": request.headers["Origin"], "Vary": "Origin"}
                if "Origin" in request.headers and self.door.origin_allowed(request) else {})
        key = bearer(request.headers.get("Authorization")) or request.query.get("api_key")
        if not self.door.keys.allows(key):
            return web.json_response(
                error_event("unauthorized", self.door.keys.refusal(key)),
                status=401, headers={"WWW-Authenticate": "Bearer", **cors})
        try:
            voices = await list_voices(self.settings)
        except VoicesUnavailable as e:
            return web.json_response(error_event("tts_unavailable", str(e)), status=503,
                                     headers=cors)
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
            name = await resolve(s, requested, "talk")
        except UnknownVoice as e:
            raise ProtocolError("unknown_voice", str(e)) from None
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
        return await self.door.upgrade(request, "/v1/talk", 4 * 48000 * MAX_MESSAGE_MS // 1000,
                                       lambda e: error_event(e.code, e.message),
                                       lambda ws: self._converse(ws, request))

    async def _converse(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        """One socket: its hello, a slot, the conversation until either side ends it."""
        t0 = time.perf_counter()
        session: TalkSession | None = None
        release: Callable[[], None] | None = None
        try:
            rate, voice = await self._hello(ws)
            settings, cache = await self.session_voice(voice)
            try:
                release = self.door.take_slot()
            except Refused as e:
                raise protocol_error(e) from None
            session = TalkSession(settings, cache, ws, rate, recorder=self.recorder)
            log.info("talk %s: start, mic %d Hz, voice %s, from %s", session.id, rate,
                     settings.tts_voice, request.remote)
            await session.run(on_end=release)
            await ws.close()
        except ConnectionResetError:
            log.info("talk: client left before starting")
        except ProtocolError as e:
            REFUSED.labels(reason=e.reason).inc()
            log.info("talk %s: %s: %s", session.id if session else "-", e.code, e.message)
            await refuse(ws, e)
        except Exception:
            log.exception("talk %s failed", session.id if session else "-")
            await refuse(ws, ProtocolError("internal", "internal error in the agent",
                                           Close.INTERNAL))
        finally:
            if release is not None:
                release()
            if session is not None:
                log.info("talk %s: end after %.1f s, %d frames sent", session.id,
                         time.perf_counter() - t0, session.outbox.audio_sent)

    async def _hello(self, ws: web.WebSocketResponse) -> tuple[int, str | None]:
        try:
            msg = await ws.receive(timeout=HELLO_TIMEOUT_S)
        except TimeoutError:
            raise ProtocolError("no_start", f'no "start" message within {HELLO_TIMEOUT_S:.0f} '
                                "s") from None
        if msg.type == WSMsgType.BINARY:
            raise ProtocolError("expected_start", 'binary audio before the "start" message',
                                Close.UNSUPPORTED_DATA)
        if msg.type == WSMsgType.TEXT:
            return parse_start(msg.data)
        if msg.type == WSMsgType.ERROR:
            raise ProtocolError("too_large", str(ws.exception()), Close.TOO_LARGE)
        raise ConnectionResetError("client left before starting")

    async def close_all(self, _app: web.Application | None = None) -> None:
        """On shutdown: every conversation ends with 1001 (going away)."""
        if self._prepare is not None:
            self._prepare.cancel()
        for task in list(self._warming):
            task.cancel()
        for ws in list(self.sockets):
            # A client that stopped reading blocks the close frame, and a client gone
            # meanwhile cancels its write (aiohttp): neither may stop the shutdown.
            close = asyncio.ensure_future(ws.close(code=Close.GOING_AWAY,
                                                   message=b"agent shutting down"))
            await asyncio.wait([close], timeout=2.0)
            if close.done() and not close.cancelled():
                close.exception()  # retrieved: said nothing more on a socket gone
            else:
                close.cancel()


TALK_HUB = web.AppKey("talk_hub", TalkHub)
