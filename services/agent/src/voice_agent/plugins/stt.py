"""livekit-agents STT plugin: the user's utterance audio -> the thinker -> transcript.

Non-streaming (`STTCapabilities(streaming=False)`): the session wraps it with the VAD
(the framework's StreamAdapter), so `_recognize_impl` gets one whole utterance, sent
to Thinker.Chat as a 16 kHz PCM audio part with a "transcribe" instruction (seed:
OmniSTT, P50 104 ms on Qwen3-Omni). temperature 0: a transcript, not a reply.

With an `UtteranceStore` (AGENT_STT_MODE=audio) there is no transcription call at all:
the utterance is kept and a marker returned at once; the LLM plugin sends the audio
to the thinker in the reply request itself (see utterances.py).

When the thinker cannot take audio (INVALID_ARGUMENT: a text-only model, such as the
tiny random transformers thinker in tests) the plugin does what `fallback` says:
- "none": raise (the framework logs it, the utterance gets no reply);
- "placeholder": return "[untranscribed speech, N.N s]" so the conversation goes on.
  This is a named test/degraded mode, not speech recognition: the LLM then answers a
  marker, not the user's words. (A faster-whisper fallback needs weights from the
  Hugging Face hub, which these machines cannot reach.)
"""

from __future__ import annotations

import logging

import grpc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    NotGivenOr,
    stt,
    utils,
)
from livekit.agents.language import LanguageCode
from livekit.agents.utils import AudioBuffer
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc

from ..metrics import TurnTracker
from ._grpc import ChannelCache, to_api_error
from .llm import frames_to_pcm16k
from .utterances import UtteranceStore

log = logging.getLogger("voice_agent.stt")

PLACEHOLDER_PREFIX = "[untranscribed speech"


class STT(stt.STT):
    def __init__(
        self,
        *,
        addr: str = "localhost:50052",
        instruction: str = "Transcribe the speech in this audio exactly. Reply with the "
        "transcript only.",
        max_tokens: int = 96,
        language: str = "en",
        fallback: str = "none",
        utterances: UtteranceStore | None = None,
        tracker: TurnTracker | None = None,
    ) -> None:
        super().__init__(
            capabilities=stt.STTCapabilities(streaming=False, interim_results=False)
        )
        if fallback not in ("none", "placeholder"):
            raise ValueError(f"STT fallback must be 'none' or 'placeholder', not {fallback!r}")
        self._addr = addr
        self._instruction = instruction
        self._max_tokens = max_tokens
        self._language = language
        self._fallback = fallback
        self._channels = ChannelCache(addr)
        self._tracker = tracker
        # "audio" mode: no transcription call, the LLM plugin sends the audio itself
        self._utterances = utterances
        self.audio_rejected = 0  # utterances the thinker refused as audio

    @property
    def model(self) -> str:
        return "voice.llm.v1/transcribe"

    @property
    def provider(self) -> str:
        return self._addr

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> stt.SpeechEvent:
        frames = buffer if isinstance(buffer, list) else [buffer]
        pcm = frames_to_pcm16k(frames)
        duration = len(pcm) / 32000.0
        lang = LanguageCode(language if utils.is_given(language) else self._language)
        request_id = utils.shortuuid()
        if self._tracker is not None:
            self._tracker.stt_started()
        if self._utterances is not None:
            if self._tracker is not None:
                self._tracker.stt_done()
            return stt.SpeechEvent(
                type=stt.SpeechEventType.FINAL_TRANSCRIPT, request_id=request_id,
                alternatives=[stt.SpeechData(language=lang, text=self._utterances.put(pcm),
                                             end_time=duration)])
        if self._tracker is not None and self._tracker.current is not None:
            request_id = f"{self._tracker.current.trace_id}-stt"
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
            async for delta in stub.Chat(req, timeout=conn_options.timeout):
                text += delta.text
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT and self._fallback == "placeholder":
                self.audio_rejected += 1
                if self._tracker is not None:
                    self._tracker.error("stt", f"thinker refused audio: {e.details()}")
                text = f"{PLACEHOLDER_PREFIX}, {duration:.1f} s]"
            else:
                if self._tracker is not None:
                    self._tracker.error("stt", f"{e.code().name}: {e.details()}")
                raise to_api_error(e, "thinker Chat (transcribe)") from None
        if self._tracker is not None:
            self._tracker.stt_done()
        log.info("stt request_id=%s audio_s=%.2f text=%r", request_id, duration, text[:80])
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT,
            request_id=request_id,
            alternatives=[stt.SpeechData(language=lang, text=text.strip(), end_time=duration)],
        )

    async def aclose(self) -> None:
        await self._channels.aclose()
