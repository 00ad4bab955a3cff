"""Configuration of the TTS service: every knob is an env var with the `TTS_` prefix.

Read once at start-up (`TTSSettings()`); a bad value fails fast with the variable's name
and what would be accepted. The engine's own knobs (packets, sampling defaults) are
passed through from here so that one table in README.md documents all of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SUPPORTED_RATES = (16000, 24000, 48000)
SUPPORTED_FRAME_MS = (10, 20, 40)


# How a client sends its key (every door's 401 says it).
KEY_HOW = ("send `authorization: Bearer <key>` (gRPC metadata; the HTTP header; or "
           "?api_key=<key> on the WebSocket)")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 quota (a
    container's `--cpus`), which affinity does not show."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every CPU
    n = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def auto_fronts(grpc_port: int, cpus: int) -> int:
    """TTS_FRONT_PROCS=auto: 2 where 8 or more CPUs are there, else 0 (one process). On the
    H100 host's CPUs at 1 frame a message, the engine's process alone spends ~60 us a frame
    (~330 streams a core); with 2 fronts ~18 us, and 384 streams went out on time (4 fronts
    did no better at 512: the engine's process is then the limit; bench/results/
    2026-11-27-front-cost). A small host keeps its cores for the engine and the clients."""
    return 2 if grpc_port and cpus >= 8 else 0


class TTSSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TTS_", extra="ignore")

    # Checkpoint directory in the official Hugging Face layout, or `preset:<name>` for
    # random weights at a named shape (tiny, tiny-1.7b, 0.6b, 1.7b): noise, for tests/demos.
    # Several, comma-separated (one of each kind: CustomVoice, Base, VoiceDesign): one
    # server, one voice namespace, each call routed by its voice (engine/engine_set.py).
    model: str = "preset:tiny"
    # Torch device: cpu, cuda, cuda:1 ...
    device: str = "cpu"
    # Weights dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16.
    dtype: str = "auto"
    # Seed for the random weights of a preset (same seed, same model).
    preset_seed: int = 0
    grpc_host: str = "0.0.0.0"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # gRPC front processes on grpc_port (fronts/front_link.py): the protocol's per-message
    # work off the engine's process, which keeps admission, pacing and the engine. 0: the
    # engine's process serves gRPC itself. Needs a fixed grpc_port. "auto": `auto_fronts`.
    front_procs: int = Field("auto", ge=0, le=64, validate_default=True)  # type: ignore[assignment]
    # /metrics (Prometheus) and /healthz; 0 disables the HTTP side.
    http_port: int = Field(8001, ge=0, le=65535)
    # Open streams at once (the engine's slots, idle ones included); the next call gets
    # RESOURCE_EXHAUSTED at once.
    max_sessions: int = Field(32, ge=1, le=4096)
    # Rows one decode step advances at most (its largest CUDA-graph bucket; the rest wait
    # their turn, least recently stepped first); the engine uses min(this, max_sessions).
    # Open streams can outnumber it by far: a paced stream stays open while its audio
    # plays, long after the engine made it (0.6B on an H100: 256 rows step in ~42 ms).
    max_batch: int = Field(256, ge=1, le=4096)
    # Talker KV-cache rows per slot: one utterance's prompt + frames (1024: ~80 s of
    # speech; a longer utterance ends at its cap). Every slot holds this many rows on the
    # device whether it speaks or not: halve it to double TTS_MAX_SESSIONS in the same memory.
    max_seq_len: int = Field(2048, ge=64, le=32768)
    # Prompts prefilled per engine iteration (a burst of n new calls starts in n / this
    # iterations). 256 cut a burst of 256 calls' TTFA p50 from 83-92 to 78-80 ms (0.6B,
    # H100, bench.run) at the cost of prefill graphs up to that batch.
    max_prefills: int = Field(64, ge=1, le=4096)
    # While a step has at most this many running rows, a new call's first step is launched
    # apart and its audio sent at once, instead of riding the batch's step and leaving one
    # iteration later (CUDA graphs); 0: never. It costs the batch that iteration's few ms.
    first_step_apart_max_rows: int = Field(32, ge=0, le=4096)
    # Admission by capacity (server/admission/admission.py): a call is admitted only while, with one
    # more speaking stream, the engine's measured frame period stays under admit_margin x
    # 80 ms (the audio one codec frame holds; also at most first_packet_frames /
    # packet_frames x 80 ms: the old start-up bound, kept for TTFA and the front's load)
    # and the event loop's predicted CPU share stays under admit_margin of a
    # core. 0 turns both off (the open-stream cap alone).
    admit_margin: float = Field(0.7, ge=0.0, le=1.0)
    # The frame period (ms) admission allows, instead of the one above (0: that one, 20 ms
    # with the default packets). On the H100 the default binds at ~50-80 speaking rows,
    # whose step the GPU runs in 11-16 ms: a larger budget admits more at a longer TTFA
    # (one step): 30 halved the refusals at 60 req/s (0.6B, H200) for 16 ms of p95 and a
    # few more late frames at utterance starts (bench/results/2026-11-28-h200).
    admit_frame_budget_ms: float = Field(0.0, ge=0.0, le=80.0)
    # A new stream counts as engine load for this long before its first text (a burst
    # of calls reserves its share at once); an idle stream costs nothing after it.
    admit_idle_grace_s: float = Field(2.0, ge=0.0)
    # Characters of text one utterance may hold (between FLUSH/STOP/RESET).
    max_text_chars: int = Field(4000, ge=1, le=1_000_000)
    # Codec frames in the first packet (each 80 ms) and the most in a later one; between
    # them a ramp: each packet at most half the audio already sent (1, 1, 1, 1, 2, 3, 4).
    first_packet_frames: int = Field(1, ge=1, le=16)
    packet_frames: int = Field(4, ge=1, le=64)
    # Speech decoder arithmetic: auto (bf16 on CUDA, fp32 on CPU), fp32 (exact), tf32 or
    # bf16 (2x the real-time streams of fp32 on an H100; 36 dB from exact). CPU stays fp32.
    decoder_precision: Literal["auto", "fp32", "tf32", "bf16"] = "auto"
    # Seconds a client may take to send its SessionConfig.
    config_timeout_s: float = Field(10.0, gt=0)
    # Audio a stream may have made but not written (a slow reader's, or paced audio
    # waiting for its time) before the engine pauses its session; resumed under half.
    # Keep it well above pace_lead_s (the engine then stays that far ahead).
    max_backlog_s: float = Field(10.0, gt=0)
    # Pacing: frame i of an utterance is written no earlier than (when its first frame
    # was written) + i x frame_ms - pace_lead_s, so the first pace_lead_s of audio goes
    # out at once (TTFA unchanged) and the rest in real time, this far ahead of a player
    # started at the first frame (plus up to 0.2 s: frames due soon go out together).
    # It keeps a fast engine's burst of a new stream from holding the event loop while
    # other streams' clients, with little buffered, wait. 0: no pacing (as fast as made).
    pace_lead_s: float = Field(1.0, ge=0)
    # On SIGTERM: seconds granted to in-flight utterances before the server exits.
    drain_timeout_s: float = Field(20.0, ge=0)
    # Seconds the engine loop may stand still (a device sync that never returns) before
    # the server declares it hung: NOT_SERVING, calls end UNAVAILABLE, the process exits 3.
    engine_stall_s: float = Field(30.0, gt=0)
    # Run the server on uvloop (libuv's event loop): ~13% less CPU per frame written than
    # asyncio's own loop (bench/front_bench.py); false: the standard asyncio loop.
    uvloop: bool = True
    log_level: str = "INFO"
    # API keys (voice_keys): comma-separated, and/or a file of one key per line, read
    # again when it changes (rotation without a restart). Neither set: no key asked.
    api_keys: SecretStr = SecretStr("")
    api_keys_file: Path | None = None
    # Web pages on other origins that may call the HTTP port (OpenAI API, WebSocket):
    # comma-separated `scheme://host[:port]`, or `*`. Same-origin pages and clients that
    # send no Origin (SDKs, curl) need nothing here (server/fronts/http_guards.py).
    cors_origins: str = ""
    # Seconds a request to the HTTP port may take to send its headers (from its first
    # byte; every request of a keep-alive connection), and the period over which its body
    # must come at 1 KiB/s or more (slow senders hold sockets: slowloris); it is closed
    # after that.
    header_timeout_s: float = Field(10.0, gt=0, le=300)
    # The voice library (server/voices/voice_library.py): cloned and designed voices, one file
    # each, kept across restarts (a volume in compose). Empty: no library (creating a
    # voice is refused; inline reference audio still works where the model clones).
    voice_dir: Path | None = None
    # Largest reference audio upload (a file or raw PCM), in bytes: 30 s of 48 kHz
    # stereo s16 is 5.8 MB. Over it: HTTP 413, gRPC RESOURCE_EXHAUSTED.
    voice_max_upload_bytes: int = Field(16 << 20, ge=1024, le=256 << 20)
    # Seconds between looks at TTS_VOICE_DIR for voices other servers sharing it (replicas
    # on one volume) created or deleted; 0: only this server's own changes.
    voice_rescan_s: float = Field(2.0, ge=0)
    # Tests only: the engine's n-th decode step fails, `<cuda|bug|hang>@<n>[:launch|tokens]`
    # (engine/faults.py `FaultInjection`; checked when the engine is built). Empty: none.
    test_fault: str = ""

    @field_validator("front_procs", mode="before")
    @classmethod
    def _front_procs(cls, v: object, info: ValidationInfo) -> object:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return auto_fronts(int(info.data.get("grpc_port") or 0), usable_cpus())
        if isinstance(v, str) and not v.strip().isdigit():
            raise ValueError(f"{v[:16]!r}: a number of processes (0-64), or auto")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        allowed = ("auto", "float32", "bfloat16", "float16")
        if v not in allowed:
            raise ValueError(f"TTS_DTYPE must be one of {allowed}, got {v!r}")
        return v

    @field_validator("voice_dir", mode="before")
    @classmethod
    def _voice_dir(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v  # empty: no library

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError(f"TTS_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, got {v!r}")
        return v
