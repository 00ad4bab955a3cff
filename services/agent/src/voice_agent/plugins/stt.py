"""livekit-agents STT plugin: the user's utterance audio -> a transcript.

Two recognisers:
- the thinker (`AGENT_STT_BACKEND=thinker`, the default): the whole utterance goes to
  Thinker.Chat as a 16 kHz PCM audio part with a "transcribe" instruction (seed:
  OmniSTT, P50 104 ms on Qwen3-Omni), temperature 0: a transcript, not a reply;
- the offline ear (`offline`, sphinx.py; its model `offline_model`: Moonshine
  tiny-en by default, or PocketSphinx): offline, in worker processes, fed while the
  user speaks, and its final pass run early, once the user has been quiet for
  `PREPARE_AFTER` of the VAD's silence hangover (undone if they speak again), so the
  transcript is usually ready when the hangover ends. With `preflight`
  (AGENT_STT_PREFLIGHT) that early transcript is sent as a preflight: the session starts
  its reply (thinker and TTS, held) on it, ~140 ms before the VAD ends the speech, and
  keeps it if the final transcript is the same.

A thinker that cannot take audio (INVALID_ARGUMENT: a text-only model, such as the tiny
random thinker of the local mesh) gets what `fallback` says: "offline" (default;
remembered, later turns go straight to it), "placeholder" (a marked "[untranscribed
speech, N.N s]" turn: a named test mode, not recognition) or "none" (an error).

The plugin is a streaming STT built on the session's VAD (as the framework's
StreamAdapter is): speech start opens a recogniser utterance, every VAD window of speech
feeds it, speech end finishes it. A failed utterance is reported as an unrecoverable STT
error (the session says its fallback phrase) and the stream goes on with the next one.

With an `UtteranceStore` (AGENT_STT_MODE=audio) there is no transcription at all: the
utterance is kept and a marker returned at once; the LLM plugin sends the audio to the
thinker in the reply request itself (see utterances.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    NotGivenOr,
    stt,
    utils,
)
from livekit.agents.language import LanguageCode
from livekit.agents.utils import AudioBuffer
from livekit.agents.vad import VAD, VADEvent, VADEventType, VADStream
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc

from ..metrics import TurnTracker
from ..speech_end import TimedVAD
from ..sphinx import Heard, SphinxError, SphinxPool, Utterance, shared_pool
from ._grpc import ChannelCache, to_api_error
from .llm import frames_to_pcm16k
from .utterances import UtteranceStore

log = logging.getLogger("voice_agent.stt")

PLACEHOLDER_PREFIX = "[untranscribed speech"
BACKENDS = ("thinker", "offline")
# Share of the VAD's silence hangover after which the recogniser finishes early: the
# caller's silence (speech_end.py) once Silero hears silence, which is ~100 ms after the
# last word (30-195 ms), so at the default 200 ms the pass starts at Silero's first silent
# window and its words (the preflight) start the reply before the end of speech.
PREPARE_AFTER = 0.3
FALLBACKS = ("offline", "placeholder", "none")
# The offline ear's old name: it was "pocketsphinx" when that was its only model (Moonshine
# is the default now: AGENT_STT_OFFLINE_MODEL); still taken, as "offline".
OLD_OFFLINE = "pocketsphinx"


class STT(stt.STT):
    def __init__(
        self,
        *,
        addr: str = "localhost:50052",
        instruction: str = "Transcribe the speech in this audio exactly. Reply with the "
        "transcript only.",
        max_tokens: int = 96,
        language: str = "en",
        backend: str = "thinker",
        fallback: str = "offline",
        vad: VAD | None = None,
        sphinx_workers: int = 2,
        offline_model: str = "moonshine",
        early_pass: bool = True,
        preflight: bool = False,
        utterances: UtteranceStore | None = None,
        tracker: TurnTracker | None = None,
        api_key: str = "",
    ) -> None:
        # without a VAD only `recognize` (whole utterances) is offered
        super().__init__(
            capabilities=stt.STTCapabilities(streaming=vad is not None, interim_results=False)
        )
        backend = "offline" if backend == OLD_OFFLINE else backend
        fallback = "offline" if fallback == OLD_OFFLINE else fallback
        if backend not in BACKENDS:
            raise ValueError(f"STT backend must be one of {BACKENDS}, not {backend!r}")
        if fallback not in FALLBACKS:
            raise ValueError(f"STT fallback must be one of {FALLBACKS}, not {fallback!r}")
        self._addr = addr
        self._instruction = instruction
        self._max_tokens = max_tokens
        self._language = language
        self._fallback = fallback
        self._vad = vad
        self._sphinx_workers = sphinx_workers
        self._offline_model = offline_model
        self.early_pass = early_pass
        self.preflight = preflight
        self._channels = ChannelCache(addr, api_key)  # the thinker's key (LLM_API_KEYS)
        self._tracker = tracker
        # "audio" mode: no transcription call, the LLM plugin sends the audio itself
        self._utterances = utterances
        # the recogniser in use; "thinker" turns into "offline" on the first refusal
        self.backend = backend
        self.audio_rejected = 0  # utterances the thinker refused as audio
        self._background: set[asyncio.Task[None]] = set()  # audio mode's ear, off the path
        self._ear_failed = False
        self.last_heard: Heard | None = None  # the latest final transcript, as the ear said it
        self._thinker_hears = False  # set by the first transcript the thinker returns

    @property
    def model(self) -> str:
        return self._offline_model if self.backend == "offline" \
            else "voice.llm.v1/transcribe"

    @property
    def ear(self) -> str:
        """The recogniser that hears the user now, by name, for the logs: "thinker", or the
        offline ear's model ("moonshine" or "pocketsphinx"); "audio" when nothing is
        transcribed (the thinker hears the utterance in the reply request)."""
        if self._utterances is not None:
            return "audio"
        return self._offline_model if self.backend == "offline" else "thinker"

    def describe(self) -> str:
        """Which ear hears the user, in words, for the start-up log."""
        if self._utterances is not None:
            return "none: the thinker hears the audio in the reply request"
        if self.backend == "offline":
            return f"{self._offline_model} (offline)"
        if self._fallback == "offline":
            return (f"the thinker at {self._addr}; {self._offline_model} (offline) if it "
                    "takes no audio")
        return f"the thinker at {self._addr} (if it takes no audio: {self._fallback})"

    @property
    def provider(self) -> str:
        return "local" if self.backend == "offline" else self._addr

    def sphinx(self) -> SphinxPool:
        return shared_pool(self._sphinx_workers, self._offline_model)

    def may_use_sphinx(self) -> bool:
        """Until the thinker has shown it takes audio, the recogniser listens too, so a
        refusal costs no extra wait."""
        if self._utterances is not None:
            return False
        return self.backend == "offline" or (
            self._fallback == "offline" and not self._thinker_hears)

    async def prewarm_async(self) -> None:
        """Start a recogniser process now if this STT may need one."""
        if self.may_use_sphinx():
            try:
                await self.sphinx().prewarm()
            except SphinxError as e:  # each utterance will try again (and report it)
                log.warning("the offline ear (%s) did not start: %s", self._offline_model, e)

    def stream(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> stt.RecognizeStream:
        if self._vad is None:
            raise RuntimeError("this STT was built without a VAD: use recognize()")
        return SpeechStream(self, vad=self._vad, language=language, conn_options=conn_options)

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> stt.SpeechEvent:
        frames = buffer if isinstance(buffer, list) else [buffer]
        return await self.transcribe(frames, None, language, conn_options)

    async def transcribe(self, frames: list[rtc.AudioFrame], utt: Utterance | None,
                         language: NotGivenOr[str], conn_options: APIConnectOptions,
                         ) -> stt.SpeechEvent:
        """The final transcript of one utterance; `utt` is a recogniser utterance already
        fed with its audio, if the stream opened one."""
        duration = sum(f.samples_per_channel / f.sample_rate for f in frames)
        lang = LanguageCode(language if utils.is_given(language) else self._language)
        request_id = utils.shortuuid()
        if self._tracker is not None:
            self._tracker.stt_started()
            if self._tracker.current is not None:
                request_id = f"{self._tracker.current.trace_id}-stt"
        self.last_heard = None  # the offline ear says how sure it was (`_sphinx`)
        if self._utterances is not None:
            text = self._utterances.put(frames_to_pcm16k(frames))
            self._hear_later(text, frames)
        elif self.backend == "offline":
            text = await self._sphinx(frames, utt)
        else:
            text = await self._thinker(frames, utt, request_id, conn_options)
        if self.last_heard is None:  # an ear that says nothing of its doubt
            self.last_heard = Heard(text)
        if self._tracker is not None:
            self._tracker.stt_done()
        log.info("stt %s request_id=%s audio_s=%.2f text=%r", self.ear, request_id,
                 duration, text[:80])
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT, request_id=request_id,
            alternatives=[stt.SpeechData(language=lang, text=text.strip(), end_time=duration)])

    async def _sphinx(self, frames: list[rtc.AudioFrame], utt: Utterance | None) -> str:
        """The transcript of an utterance fed as it was spoken (`utt`), else of `frames`;
        how sure the ear was of it in `last_heard` (the end-of-turn policy reads it)."""
        try:
            if utt is not None:
                heard = await utt.finish()
            else:
                async with self.sphinx().utterance() as whole:
                    whole.feed(frames_to_pcm16k(frames))
                    heard = await whole.finish()
        except SphinxError as e:
            self._error(str(e))
            raise APIConnectionError(f"pocketsphinx: {e}", retryable=False) from None
        self.last_heard = heard
        return heard.text

    async def _thinker(self, frames: list[rtc.AudioFrame], utt: Utterance | None,
                       request_id: str, conn_options: APIConnectOptions) -> str:
        pcm = frames_to_pcm16k(frames)
        req = thinker_pb2.ChatRequest(
            messages=[thinker_pb2.Message(role=thinker_pb2.ROLE_USER, parts=[
                thinker_pb2.Part(text=self._instruction),
                thinker_pb2.Part(audio=thinker_pb2.AudioPart(
                    data=pcm, format=thinker_pb2.AUDIO_FORMAT_PCM_S16LE, sample_rate=16000)),
            ])],
            max_tokens=self._max_tokens, temperature=0.0, request_id=request_id,
        )
        stub = thinker_pb2_grpc.ThinkerStub(self._channels.get())
        text = ""
        try:
            async for delta in stub.Chat(req, timeout=conn_options.timeout,
                                         metadata=self._channels.metadata):
                text += delta.text
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT or self._fallback == "none":
                self._error(f"{e.code().name}: {e.details()}")
                raise to_api_error(e, "thinker Chat (transcribe)") from None
            self.audio_rejected += 1
            if self._fallback == "placeholder":
                self._error(f"thinker refused audio: {e.details()}")
                return f"{PLACEHOLDER_PREFIX}, {len(pcm) / 32000.0:.1f} s]"
            # expected where the thinker is text-only (the local mesh's tiny one): the
            # configured fallback, said once per STT, not a fault of the call
            log.info("the thinker takes no audio (%s): the offline ear (%s) transcribes "
                     "from now on", e.details(), self._offline_model)
            self.backend = "offline"
            return await self._sphinx(frames, utt)
        self._thinker_hears = True
        if utt is not None:
            with contextlib.suppress(SphinxError):  # the thinker heard it: not needed
                utt.cancel()
        return text

    def _hear_later(self, marker: str, frames: list[rtc.AudioFrame]) -> None:
        """The utterance's words by the offline ear, in the background (audio mode: the
        thinker hears the audio; the words are for the page and the history)."""
        store = self._utterances
        assert store is not None

        async def hear() -> None:
            words = None
            try:
                async with self.sphinx().utterance() as whole:
                    whole.feed(frames_to_pcm16k(frames))
                    words = (await whole.finish()).text.strip()
            except Exception as e:  # the page shows the marker; the reply is not affected
                if not self._ear_failed:
                    log.warning("the background ear (%s) failed: %s; transcripts show "
                                "utterance markers", self._offline_model, e)
                self._ear_failed = True
            finally:
                store.heard(marker, words)

        task = asyncio.create_task(hear(), name="stt-background-ear")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _error(self, err: str) -> None:
        if self._tracker is not None:
            self._tracker.error("stt", err)

    @property
    def utterances(self) -> UtteranceStore | None:
        """Audio mode's store (the words of its markers), else None."""
        return self._utterances

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self._channels.aclose()


class RecogniserFeed:
    """The offline recogniser's utterance for the speech under way: fed as the user
    speaks, its final pass run early once they are quiet (undone if they speak again).
    One per VAD speech segment; `aclose` gives its worker back."""

    def __init__(self, prepare_after_s: float | None,
                 on_preflight: Callable[[str], None] | None = None) -> None:
        self.utt: Utterance | None = None  # None: no recogniser for this speech
        self._lease = contextlib.AsyncExitStack()  # holds the recogniser's worker
        self._resampler: rtc.AudioResampler | None = None  # made at a first non-16 kHz frame
        self._prepare_after_s = prepare_after_s  # quiet this long: finish early (None: never)
        self._prepared = False  # the final pass has run (the user is quiet)
        # told the early pass's transcript while the user is still quiet (the preflight)
        self._on_preflight = on_preflight
        self._preflight: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, stt_: STT, prepare_after_s: float | None,
                   on_preflight: Callable[[str], None] | None = None) -> RecogniserFeed:
        feed = cls(prepare_after_s, on_preflight)
        try:
            feed.utt = await feed._lease.enter_async_context(stt_.sphinx().utterance())
        except SphinxError as e:  # reported at the end of speech
            log.warning("no recogniser for this utterance: %s", e)
        return feed

    def feed(self, frames: list[rtc.AudioFrame]) -> None:
        if self.utt is None:
            return
        for f in frames:
            if f.sample_rate != 16000 and self._resampler is None:
                self._resampler = rtc.AudioResampler(f.sample_rate, 16000, num_channels=1)
            out = self._resampler.push(f) if self._resampler is not None else [f]
            with contextlib.suppress(SphinxError):  # a dead worker: finish() says so
                for g in out:
                    self.utt.feed(bytes(g.data))

    def quiet_for(self, quiet_s: float) -> None:
        """The user has been quiet `quiet_s` (the VAD's silence so far): finish early, or
        take it back when they speak again."""
        if self.utt is None or self._prepare_after_s is None:
            return
        quiet = quiet_s >= self._prepare_after_s
        if quiet != self._prepared:
            self._prepared = quiet
            with contextlib.suppress(SphinxError):  # a dead worker: finish() says so
                if quiet:
                    self.utt.prepare()
                    if self._on_preflight is not None:
                        self._preflight = asyncio.create_task(self._tell_preflight())
                else:
                    self.utt.resume()

    async def _tell_preflight(self) -> None:
        """The early pass's transcript, if the user is still quiet when it comes: the
        session's reply may start on it (held until the turn ends; dropped if the final
        transcript differs)."""
        assert self.utt is not None and self._on_preflight is not None
        with contextlib.suppress(SphinxError):  # a dead worker: finish() says so
            heard = await self.utt.preflight()
            if heard is not None and heard.text.strip() and self._prepared:
                self._on_preflight(heard.text.strip())

    async def aclose(self) -> None:
        if self._preflight is not None:
            self._preflight.cancel()
        await self._lease.aclose()


class SpeechStream(stt.RecognizeStream):
    """VAD-segmented utterances; each one fed to the recogniser as the user speaks."""

    def __init__(self, stt_: STT, *, vad: VAD, language: NotGivenOr[str],
                 conn_options: APIConnectOptions) -> None:
        super().__init__(stt=stt_, conn_options=conn_options)
        self._stt_: STT = stt_
        self._vad = vad
        self._language = language
        hangover = getattr(vad, "min_silence_duration", None)
        self._prepare_after_s = (PREPARE_AFTER * hangover
                                 if hangover and stt_.early_pass else None)

    async def _run(self) -> None:
        # the conversation's VAD as the session's stream hears it (Silero once, not twice)
        vad_stream = self._vad.follow() if isinstance(self._vad, TimedVAD) else self._vad.stream()
        tasks = [asyncio.create_task(self._forward(vad_stream), name="stt_forward"),
                 asyncio.create_task(self._recognize(vad_stream), name="stt_recognize")]
        try:
            await asyncio.gather(*tasks)
        finally:
            await utils.aio.cancel_and_wait(*tasks)
            await vad_stream.aclose()

    async def _forward(self, vad_stream: VADStream) -> None:
        async for item in self._input_ch:
            if isinstance(item, self._FlushSentinel):
                vad_stream.flush()
            else:
                vad_stream.push_frame(item)
        vad_stream.end_input()

    async def _recognize(self, vad_stream: VADStream) -> None:
        feed: RecogniserFeed | None = None  # the speech under way's, if the recogniser listens
        try:
            async for ev in vad_stream:
                if ev.type == VADEventType.START_OF_SPEECH:
                    self._event_ch.send_nowait(
                        stt.SpeechEvent(type=stt.SpeechEventType.START_OF_SPEECH))
                    if self._stt_.may_use_sphinx():
                        feed = await RecogniserFeed.open(
                            self._stt_, self._prepare_after_s,
                            self._preflight if self._stt_.preflight else None)
                        feed.feed(ev.frames)
                elif ev.type == VADEventType.INFERENCE_DONE and ev.speaking:
                    if feed is not None:
                        feed.feed(ev.frames)
                        feed.quiet_for(ev.raw_accumulated_silence)
                elif ev.type == VADEventType.END_OF_SPEECH:
                    ended, feed = feed, None
                    await self._end_of_speech(ev, ended)
        finally:
            if feed is not None:
                await feed.aclose()

    def _preflight(self, text: str) -> None:
        """The early pass's words, before the VAD's hangover ends: the framework starts
        its preemptive reply on them (kept if the final transcript is the same)."""
        lang = LanguageCode(self._language if utils.is_given(self._language)
                            else self._stt_._language)
        self._event_ch.send_nowait(stt.SpeechEvent(
            type=stt.SpeechEventType.PREFLIGHT_TRANSCRIPT,
            alternatives=[stt.SpeechData(language=lang, text=text)]))

    async def _end_of_speech(self, ev: VADEvent, feed: RecogniserFeed | None) -> None:
        speech_end = time.time() - ev.silence_duration - ev.inference_duration
        self._event_ch.send_nowait(stt.SpeechEvent(
            type=stt.SpeechEventType.END_OF_SPEECH, speech_end_time=speech_end))
        try:
            final = await self._stt_.transcribe(ev.frames, feed.utt if feed else None,
                                                self._language, self._conn_options)
        except APIError as e:
            final = None
            self._emit_error(e, recoverable=False)
        finally:
            if feed is not None:
                await feed.aclose()
        if final is not None and final.alternatives[0].text:
            final.speech_end_time = speech_end
            self._event_ch.send_nowait(final)
