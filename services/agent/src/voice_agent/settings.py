"""Every knob of the agent, read from the environment in one place.

AGENT_* configures our parts (addresses, bridge, VAD, turn handling); LIVEKIT_* are the
names the LiveKit SDKs use, kept unprefixed so one .env serves the token service, the
agent and the CLI tools alike. A bad value fails at start-up with the variable's name
and what to fix, never mid-call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .backchannel import DEFAULT_WORDS as DEFAULT_BACKCHANNEL_WORDS
from .marks import TOPIC_LATENCY


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENT_", extra="ignore", frozen=True,
                                      populate_by_name=True)

    # --- backends -------------------------------------------------------------
    # host:port of the TTS gRPC server (voice.tts.v1.TextToSpeech).
    tts_addr: str = "localhost:50051"
    # The TTS's API key, if it asks for one (its TTS_API_KEYS); never logged.
    tts_api_key: SecretStr = SecretStr("")
    # host:port of the thinker gRPC server (voice.llm.v1.Thinker).
    thinker_addr: str = "localhost:50052"
    # The thinker's API key, if it asks for one (its LLM_API_KEYS); never logged.
    llm_api_key: SecretStr = SecretStr("")
    # Port of the agent's own HTTP server: /metrics (Prometheus) and /healthz (0 = off).
    http_port: int = Field(8003, ge=0, le=65535)
    # Interface the HTTP server binds.
    http_host: str = "0.0.0.0"
    # Concurrent conversations on the HTTP server's WebSocket transport, GET /v1/talk
    # (talk/; no LiveKit), counted from each one's `start`. 0 = no route.
    ws_max_sessions: int = Field(4, ge=0, le=1000)
    # `serve-direct` processes sharing http_port (SO_REUSEPORT: the kernel spreads the
    # connections), each with ws_max_sessions slots; /metrics sums them all. One event
    # loop is one core: compose runs STACK_CONVERSATIONS / 8 (deploy/sizing.py).
    procs: int = Field(1, ge=1, le=256)
    # API keys /v1/talk asks for (voice_keys): comma-separated, and/or a file of one a
    # line, read again when it changes. `Authorization: Bearer <key>`, or ?api_key= from a
    # browser. Neither set: no key asked (the local mesh; bind to loopback).
    api_keys: SecretStr = SecretStr("")
    api_keys_file: Path | None = None
    # Web pages on other hosts that may open /v1/talk: comma-separated
    # `scheme://host[:port]`, or `*`. Pages on the agent's own host (any port) need nothing.
    ws_origins: str = ""
    # /v1/talk admission: a new conversation is refused (close 1013 `busy`, counted as
    # reason "overloaded") while this process runs its timers later than this, in ms
    # (load.py: the 95th percentile over 10 s of the event loop's lag and of the paced
    # replies' 20 ms ticks); conversations under way go on. 0 = off.
    admit_max_lag_ms: int = Field(40, ge=0, le=10_000)


    # --- TTS session --------------------------------------------------------------
    # The agent's voice: a name from the TTS server's ListVoices, a preset or a voice of
    # its voice library (made with POST /v1/audio/voices; services/tts/README.md).
    # Checked at start-up (an error in the log if the TTS has no such voice); a
    # conversation on /v1/talk may ask for another (its start's "voice").
    tts_voice: str = "serena"
    # Language for the TTS ("auto" lets the model decide).
    tts_language: str = "auto"
    # PCM rate we ask the TTS for; 24000 is the model's native rate (no resampling).
    tts_sample_rate: Literal[16000, 24000, 48000] = 24000
    # Frame size the TTS sends; each frame is pushed to the output as soon as it lands.
    tts_frame_ms: Literal[10, 20, 40] = 20
    # Fixed sampling seed (same seed + same text = same audio); unset = server random.
    tts_seed: int | None = None
    # Cap on codec frames per utterance (12.5 per second of audio); 0 = the server's
    # guard, from the text length (~2.5x real speech: services/tts length_guard.py).
    # Random-weight test models never stop on their own: tests may cap them tighter here.
    tts_max_frames: int = Field(0, ge=0, le=100_000)

    # --- thinker -------------------------------------------------------------------
    # System prompt of the conversation.
    system_prompt: str = (
        "You are a friendly voice assistant. Answer briefly, in one or two short spoken "
        "sentences, in the language the user speaks. No lists, no markdown."
    )
    # Upper bound on reply tokens (seed: 150 keeps a spoken reply short). 0: the thinker's own
    # default (LLM_DEFAULT_MAX_TOKENS): compose's agent runs against either profile's
    # thinker, and the random CPU one keeps its replies short (32) while real weights keep 150.
    llm_max_tokens: int = Field(150, ge=0, le=4096)
    # Sampling temperature of replies (seed: 0.3).
    llm_temperature: float = Field(0.3, ge=0.0, le=2.0)
    # Sampling seed for replies (reproducible runs); unset = random.
    llm_seed: int | None = None
    # Bounded multi-turn context: at most this many user/assistant messages go to the
    # thinker (oldest dropped first); the system prompt is always kept.
    max_context_messages: int = Field(16, ge=1, le=512)
    # The greeting spoken when a session starts ("" = say nothing).
    greeting: str = "Hello! How can I help you?"
    # What the agent says when the thinker fails mid-turn ("" = stay silent).
    fallback_reply: str = "Sorry, I had a problem. Could you say that again?"

    # --- tools the operator runs (tools.py) --------------------------------------------
    # Function tools the agent itself runs, on every path (LiveKit, /v1/talk, /v1/realtime):
    # comma-separated "package.module:attr" entry points, each a livekit-agents
    # @function_tool or a list of them ("" = none). The module must be importable.
    tools: str = ""
    # A tool that runs longer is stopped; the model sees an error result instead.
    tool_timeout_s: float = Field(10.0, gt=0.0, le=600.0)
    # Said while a tool runs longer than tool_filler_after_s ("" = stay silent).
    tool_filler: str = "One moment, please."
    tool_filler_after_s: float = Field(1.0, ge=0.0, le=60.0)

    # --- STT (utterance audio -> transcript) ---------------------------------------------
    # "transcribe": the utterance audio goes to a recogniser for a transcript, which the
    # LLM then answers (the chat context holds words).
    # "audio": no transcription; the reply request carries the utterance audio itself
    # (one thinker call a turn, needs an audio-capable thinker; the context holds markers).
    stt_mode: Literal["transcribe", "audio"] = "transcribe"
    # Recogniser of "transcribe": "thinker" (its audio path, the GPU default) or
    # "offline" (the offline ear: stt_offline_model on the CPU, in worker processes;
    # English only). "pocketsphinx", its old name, is still taken (as "offline").
    stt_backend: Literal["thinker", "offline"] = "thinker"
    # When the thinker cannot take audio (INVALID_ARGUMENT, e.g. a text-only model):
    # "offline" = the offline ear from then on; "placeholder" = hand the LLM a
    # clearly marked "[untranscribed speech, N.N s]" turn (a test mode, never production);
    # "none" = an STT error (the fallback phrase is spoken). "pocketsphinx": "offline".
    stt_fallback: Literal["offline", "placeholder", "none"] = "offline"
    # The offline ear's model ("offline" above): "moonshine" (Moonshine tiny-en,
    # in the moonshine-voice wheel) or "pocketsphinx". Chosen by bench/ear.py on 2 cores,
    # espeak-ng speech in 5 voices x 3 rates: WER 0.15 vs 0.59 (services/agent/README).
    stt_offline_model: Literal["moonshine", "pocketsphinx"] = "moonshine"
    # Offline recogniser worker processes of this agent process (one per concurrent
    # utterance).
    stt_workers: int = Field(2, ge=1, le=64)
    # ONNX Runtime intra-op threads of each Moonshine worker (no spinning; one inter-op
    # thread). The wheel's own library took one per core and more (46 on 16 cores), so
    # many workers on one host fought over the cores; 1 suits a worker per conversation.
    stt_threads: int = Field(1, ge=1, le=64)
    # PocketSphinx runs its final pass early, once the user has been quiet for 30 % of
    # the VAD's hangover (redone if they go on), so the transcript is ready when the
    # hangover ends. Off: the pass runs after it (~100-250 ms later).
    stt_early_pass: bool = True
    # The early pass's transcript as a preflight: the reply (thinker, TTS) starts on it,
    # held until the turn ends and kept if the final transcript is the same. With the end
    # of speech at the hangover of the caller's silence (AGENT_VAD_END=speech) the turn is
    # decided ~200 ms after the last word, before a reply started at the final transcript
    # could be ready (~130 ms of ear, thinker and TTS): the preflight starts it ~100 ms
    # sooner (bench/README.md "The end of speech at the caller's silence").
    stt_preflight: bool = True
    # Instruction sent with the utterance audio to the thinker.
    stt_instruction: str = (
        "Transcribe the speech in this audio exactly. Reply with the transcript only."
    )
    # Transcription requests are short; cap the tokens.
    stt_max_tokens: int = Field(96, ge=1, le=1024)

    # --- bridge: LLM text -> TTS (seed 001) --------------------------------------------
    # The reply's first starter_max_chars go to the TTS piece by piece as the LLM writes
    # them (the engine starts at its first stable word: bridge.py); no segment after
    # them is shorter than starter_min_chars.
    bridge_starter_min_chars: int = Field(2, ge=1, le=64)
    bridge_starter_max_chars: int = Field(6, ge=1, le=64)
    # After the starter: flush at punctuation once a segment holds min_chars, else cut
    # at a word boundary once it holds min..max chars (hard cut at max).
    bridge_min_chars: int = Field(8, ge=1, le=256)
    bridge_max_chars: int = Field(12, ge=1, le=256)
    # Send Control FLUSH after each segment that ends a sentence (a TTS engine that
    # waits for more text then speaks it at once); FLUSH always ends the reply. Replies in
    # an in-context clone are flushed per sentence whatever this says (plugins/tts.py).
    bridge_flush_on_sentence: bool = False
    # Cache of synthesized starter phrases (the greeting and fallback): "on" replays
    # cached audio for a reply that is exactly a cached phrase.
    starter_cache: bool = True

    # --- VAD and turn handling ------------------------------------------------------------
    # Silero speech probability to start speech.
    vad_activation_threshold: float = Field(0.5, gt=0.0, lt=1.0)
    # The silence before the VAD ends the utterance (the hangover; seed: 200 ms; the
    # framework's turn model needs at least 250 ms). With vad_end "speech" it is the
    # caller's silence, counted from the last speech sample as the audio places it
    # (speech_end.py); with "vad", Silero's own, whose speech probability outlasts the
    # speech by ~100 ms (200 ms of it was ~300 ms of the caller's silence under every
    # turn). Either way the end of speech carries the silence since the last speech
    # sample, so the endpointing delays below count from when the caller stopped. A
    # hangover shorter than a comma's pause ends the turn there ("Hello," answered before
    # "can you hear me?": espeak-ng's comma pauses are 110-270 ms, flite's up to 340).
    # 150 ms decided no sooner on the H200 sweep (the word rule waits for the ear's pass,
    # done by 200 ms, not by 150) and lost the reply's head start (bench/README.md "A
    # decision at 150 ms, tried").
    vad_silence_ms: int = Field(200, ge=32, le=5000)
    vad_end: Literal["speech", "vad"] = "speech"
    # Speech needed before the VAD starts an utterance.
    vad_min_speech_ms: int = Field(64, ge=32, le=2000)
    # End of turn: "vad" = the VAD's silence plus the endpointing delay below; "text" =
    # behind the VAD, the transcript's last word (turn_words.py: a turn rarely ends on
    # "to", "the", "and", "is" ...): an unlikely end waits up to max_endpointing_delay_s;
    # "model" = livekit-agents' local audio turn detector (turn-detector-v1-mini, offline)
    # in the same place. On espeak-ng speech "model" does not separate ends of sentences
    # (p 0.19-0.41) from pauses inside them (0.08-0.27) at its 0.36 threshold, so half of
    # finished turns waited 3 s. bench/turns.py compares them (services/agent/README.md):
    # "text" cut off 1 of 8 paused turns at end of turn -> first audio p50 515 ms, "vad"
    # 6 of 8 at 505 ms (0 of 8 needs min_endpointing_delay_s 0.9: p50 1,112 ms).
    # "audio" = Smart Turn v3.2 on the turn's audio (smart_turn.py); "fused" = the words
    # hold a turn they say is unfinished, else the audio decides (conversation/turn_end.py).
    turn_detection: Literal["audio", "fused", "model", "text", "vad"] = "text"
    # The audio turn model (AGENT_TURN_DETECTION=audio|fused): Smart Turn v3.2's ONNX file
    # ("" = the copy `make venvs` takes from the pipecat-ai wheel; smart_turn.py).
    smart_turn_model: str = ""
    # Threads of the process's one Smart Turn session (its batches of conversations).
    smart_turn_threads: int = Field(1, ge=1, le=16)
    # The page's opt-in "you cut me off" / "too slow" buttons save that turn's audio and
    # the agent's decision here ("" = off: nothing is written), at most feedback_max_mb.
    feedback_dir: str = ""
    feedback_max_mb: int = Field(200, ge=1, le=100_000)
    # The wait when the detector finds the end likely, after the last speech sample (as
    # the audio places it, speech_end.py): 0.2 s is within the VAD's own hangover, so a
    # confident turn ends at the first silence the VAD reports (0.3 s, the seed's, added
    # ~16 ms p50 on the H100 sweep; the synthetic set cut 3 more of 160 paused turns at
    # 0.2: bench/README.md).
    min_endpointing_delay_s: float = Field(0.2, ge=0.0, le=10.0)
    # The wait when the detector doubts the turn is over (after the last speech sample;
    # speech meanwhile keeps the turn open). 1 s holds the 400-900 ms pauses people make
    # inside a sentence, and bounds what a wrong doubt costs a finished turn (3 s held
    # 13 of 64 complete turns ~3 s on the H200 sweep, when the ear misheard a last word).
    max_endpointing_delay_s: float = Field(1.0, ge=0.1, le=30.0)
    # A turn of at most this many words that the detector finds complete ("Hello.",
    # "Yes, please.") waits short_turn_delay_s instead: such words often open a sentence
    # with a comma's pause after them (espeak-ng and flite: 110-340 ms, synthetic), which
    # the 200 ms hangover of the caller's silence ends; speech meanwhile keeps the turn
    # open (seen ~40 ms after it starts). 0 words: no such wait.
    short_turn_words: int = Field(2, ge=0, le=20)
    short_turn_delay_s: float = Field(0.35, ge=0.0, le=10.0)
    # The ear's own doubt (Moonshine, the offline ear): words it wrote with less than this
    # probability of ending there (its end token's) are in doubt like unfinished words
    # (the long wait). An utterance cut at "how to get to" is often written "how to get"
    # or "how to get it", which the words alone take for a finished turn. Off by default:
    # on synthetic speech (bench/README.md "The ear's own doubt") 0.95 held every
    # espeak-ng pause after "to"/"the" (13 of 30 cut without), none more of flite's, and
    # kept 17 more of 160 complete turns waiting max_endpointing_delay_s; on the GPU
    # sweep's callers it would keep 112 of 435 complete turns waiting (27 without: the ear
    # writes espeak-ng's "For two people tonight" right, at 0.69-0.86). Measure on your
    # callers' voices (bench/turn_eval.py --ear-min-end) before turning it on. 0: the
    # words alone.
    turn_ear_min_end: float = Field(0.0, ge=0.0, le=1.0)
    # Also in doubt: a last word the ear wrote with less than this probability (0: off).
    # 0.4 held 2 more of those 63 pauses, and 9 more complete turns; and an unsure last
    # word is no reason to make a finished turn wait ("Tell me something nice." heard as
    # "... something, eyes." at 0.35).
    turn_ear_min_last: float = Field(0.0, ge=0.0, le=1.0)
    # Start the LLM as soon as the transcript is in, during the endpointing delay
    # (the framework's preemptive generation; cancelled if the user goes on).
    preemptive_generation: bool = True
    # Also start the TTS preemptively: the reply's first audio is made during the wait,
    # held, and heard the moment the turn ends (dropped unheard if the user goes on; the
    # work lost is agent_wasted_replies_total).
    preemptive_tts: bool = True
    # The framework's markdown and emoji filters on reply text before the TTS. They hold
    # text that may still turn out to be markdown (an unpaired * or `, an open [) until
    # it resolves: off for a thinker prompted never to write markdown, and for
    # random-weight benchmarks (their text held the first TTS text 1.4 s on the H100).
    tts_text_filters: bool = True
    # Barge-in: user speech during SPEAKING cancels the reply (cascade in duplex.py).
    allow_interruptions: bool = True
    # Speech the VAD must hear during SPEAKING before it counts as a barge-in.
    min_interruption_ms: int = Field(64, ge=0, le=5000)
    # Backchannels (duplex.py, backchannel.py): user speech over the reply pauses it at
    # once; "yeah", "okay", "mm-hmm" or no words at all (a cough) resume it where it
    # paused; other words, or talk longer than backchannel_max_ms, cut it (barge-in).
    # Off: any speech over the reply cuts it.
    backchannel_resume: bool = True
    backchannel_words: str = Field(DEFAULT_BACKCHANNEL_WORDS, min_length=1)
    backchannel_max_ms: int = Field(1500, ge=100, le=5000)
    # After the user falls silent in a pause: how long the transcript may take to come.
    backchannel_wait_ms: int = Field(600, ge=50, le=5000)

    # --- LiveKit (unprefixed; the SDK's own names) ------------------------------------------
    livekit_url: str = Field("", validation_alias="LIVEKIT_URL")
    livekit_api_key: str = Field("", validation_alias="LIVEKIT_API_KEY")
    livekit_api_secret: str = Field("", validation_alias="LIVEKIT_API_SECRET")
    # Agent name for explicit dispatch ("" = automatic dispatch to every new room).
    agent_name: str = ""
    # Data-message topic for the per-turn latency report the web page (and AutoRTC) reads.
    latency_topic: str = TOPIC_LATENCY

    @field_validator("stt_backend", "stt_fallback", mode="before")
    @classmethod
    def _offline_ear(cls, value: object) -> object:
        """The offline ear's old name ("pocketsphinx", from when that was its only model)."""
        return "offline" if value == "pocketsphinx" else value

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        for name in ("tts_addr", "thinker_addr"):
            value = getattr(self, name)
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"AGENT_{name.upper()}={value!r}: expected host:port")
        if self.bridge_starter_min_chars > self.bridge_starter_max_chars:
            raise ValueError(
                "AGENT_BRIDGE_STARTER_MIN_CHARS must be <= AGENT_BRIDGE_STARTER_MAX_CHARS"
            )
        if self.turn_detection == "model" and self.vad_silence_ms < 250:
            raise ValueError("AGENT_TURN_DETECTION=model needs AGENT_VAD_SILENCE_MS >= 250 "
                             "(or AGENT_TURN_DETECTION=vad)")
        if self.bridge_min_chars > self.bridge_max_chars:
            raise ValueError("AGENT_BRIDGE_MIN_CHARS must be <= AGENT_BRIDGE_MAX_CHARS")
        return self

    def require_livekit(self) -> None:
        """Fail fast when the worker mode lacks its LiveKit credentials."""
        missing = [
            env
            for env, value in (
                ("LIVEKIT_URL", self.livekit_url),
                ("LIVEKIT_API_KEY", self.livekit_api_key),
                ("LIVEKIT_API_SECRET", self.livekit_api_secret),
            )
            if not value
        ]
        if missing:
            raise SystemExit(
                f"worker mode needs {', '.join(missing)} (or run with --direct, no LiveKit)"
            )


def load_settings(**overrides: object) -> AgentSettings:
    """Read the environment (plus explicit overrides); exit with a clear message if bad."""
    try:
        return AgentSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "settings"
            env = loc if loc.isupper() else f"AGENT_{loc.upper()}"
            lines.append(f"  {env}: {err['msg']}")
        raise SystemExit("bad agent configuration:\n" + "\n".join(lines)) from None
