"""The vLLM backend: AsyncLLM (vLLM's async engine; AsyncLLMEngine is an alias of it).

The engine core runs in its own process (hence the __main__ guard in server.py); this
side renders the chat template, sends token ids (or text + audio for an omni model) with
DELTA output, and maps RequestOutputs to Chunks. vLLM does its own detokenizing and stop
strings (held back, never sent), so none of backends/text.py is used here.

Cancellation: `AsyncLLM.generate` aborts its request when its generator is closed or
cancelled; `abort` calls `AsyncLLM.abort` too, which drops the request from the output
processor and tells the engine core to free it before its next step.
`EngineSteps` (a vLLM stat logger) records the scheduler's running-request count after
every engine step, so tests can see the core stop stepping, not just the stream end.

Audio: when the model class says it takes audio (SupportsMultiModal.get_placeholder_str
("audio") answers, as Qwen2.5/3-Omni's do), each clip's sentinel in the rendered prompt is
replaced by the model's placeholder and the clip goes in multi_modal_data; vLLM's
processor expands the placeholder to the clip's length.

Tools (backends/tools.py, shared with the transformers backend): the chat template renders
them, the same parser finds calls in the streamed text, and REQUIRED / a named function
send the same call grammar as EBNF through vLLM's structured outputs (xgrammar there too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from voice_llm.backends.base import (
    AUDIO_SENTINEL,
    PlainText,
    chat_template_messages,
    check_prompt_len,
    render_prompt,
    warmup_job,
)
from voice_llm.backends.tools import (
    ToolCallParser,
    call_ebnf,
    chunks_of,
    finish_reason,
    template_tools,
)
from voice_llm.chat import SAMPLE_RATE, ChatJob, Chunk, FinishReason
from voice_llm.errors import Aborted, InvalidInput
from voice_llm.settings import Settings

log = logging.getLogger(__name__)

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


def engine_args(settings: Settings, model_path: Path, audio: bool) -> Any:
    """LLM_* settings -> AsyncEngineArgs (kept apart so it is testable without an engine)."""
    from vllm import AsyncEngineArgs

    return AsyncEngineArgs(
        model=str(model_path),
        tokenizer=str(model_path),
        max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        quantization=settings.quantization or None,
        kv_cache_dtype=settings.kv_cache_dtype,  # type: ignore[arg-type]
        dtype=settings.dtype,  # type: ignore[arg-type]
        enforce_eager=settings.enforce_eager,
        max_num_seqs=settings.max_num_seqs,
        limit_mm_per_prompt={"audio": settings.max_audio_per_prompt} if audio else {},
        disable_log_stats=False,  # EngineSteps needs the scheduler stats
    )


def audio_placeholder(model_path: Path) -> Callable[[int], str] | None:
    """The model's prompt placeholder for its i-th audio clip (1-based), or None for a
    model that cannot hear. Decided by vLLM's own model class for the checkpoint."""
    import json

    from vllm import ModelRegistry

    archs = json.loads((model_path / "config.json").read_text()).get("architectures") or []
    for arch in archs:
        # vLLM's lookup by architecture name; None for an architecture it does not know.
        cls = ModelRegistry._try_load_model_cls(arch)
        if cls is None or not hasattr(cls, "get_placeholder_str"):
            continue
        try:
            if cls.get_placeholder_str("audio", 1) is None:
                return None
        except (ValueError, NotImplementedError):  # a multimodal model without audio
            return None
        return lambda i, cls=cls: cls.get_placeholder_str("audio", i)
    return None


class EngineSteps:
    """A vLLM stat logger: after each engine step, how many requests the scheduler runs."""

    def __init__(self) -> None:
        self.steps = 0
        self.running = 0
        self.last_step_at = 0.0

    def record(self, scheduler_stats: Any, iteration_stats: Any, *a: Any, **kw: Any) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            self.running = scheduler_stats.num_running_reqs + scheduler_stats.num_waiting_reqs
            self.last_step_at = time.monotonic()

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, *a: Any) -> None:
        pass


class VllmBackend:
    name = "vllm"

    def __init__(self, settings: Settings, model_path: Path) -> None:
        self._settings = settings
        self._path = model_path
        self.engine: Any = None
        self.tokenizer: Any = None
        self.steps: EngineSteps | None = None
        self._placeholder = audio_placeholder(model_path)
        self.accepts_audio = self._placeholder is not None

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(self._settings, self._path, self.accepts_audio)
        t0 = time.perf_counter()
        steps = self.steps = EngineSteps()
        # A per-engine stat logger factory: (vllm_config, engine_index) -> logger.
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[lambda cfg, i: steps])
        self.tokenizer = self.engine.get_tokenizer()
        self._plain = PlainText(self.tokenizer)
        log.info(
            "vLLM engine up",
            extra={
                "seconds": round(time.perf_counter() - t0, 1),
                "model": str(self._path),
                "accepts_audio": self.accepts_audio,
            },
        )
        async for _ in self.generate(warmup_job()):
            pass

    def _prompt(self, job: ChatJob) -> tuple[dict[str, Any], int | None]:
        messages, clips = chat_template_messages(job.messages, self._plain)
        text = render_prompt(self.tokenizer, messages, template_tools(job.active_tools))
        if clips:
            assert self._placeholder is not None, "audio reached a model that cannot hear"
            pieces = text.split(AUDIO_SENTINEL)
            assert len(pieces) == len(clips) + 1, "one sentinel per clip"
            text = pieces[0] + "".join(
                self._placeholder(i) + rest for i, rest in enumerate(pieces[1:], start=1)
            )
            audio = [(c.samples, SAMPLE_RATE) for c in clips]
            # The prompt's length is known only after vLLM's processor expands the audio.
            return {"prompt": text, "multi_modal_data": {"audio": audio}}, None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        check_prompt_len(len(ids), self._settings.max_model_len)
        return {"prompt_token_ids": ids}, len(ids)

    async def generate(self, job: ChatJob) -> AsyncIterator[Chunk]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        prompt, n_prompt = self._prompt(job)
        o = job.options
        max_tokens = o.max_tokens
        if n_prompt is not None:
            max_tokens = min(max_tokens, self._settings.max_model_len - n_prompt)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=o.temperature,
            top_p=o.top_p,
            stop=list(o.stop) or None,
            seed=o.seed,
            output_kind=RequestOutputKind.DELTA,
            skip_special_tokens=True,
            structured_outputs=(StructuredOutputsParams(grammar=call_ebnf(job))
                                if job.tool_choice.constrained else None),
        )
        tools = job.active_tools
        calls = ToolCallParser([t.name for t in tools]) if tools else None
        stream = self.engine.generate(prompt, params, job.request_id)
        try:
            async for out in stream:
                c = out.outputs[0]
                n_prompt = len(out.prompt_token_ids or ())
                events = [c.text] if calls is None else calls.feed(c.text)
                if not out.finished:
                    for chunk in chunks_of(events, len(c.token_ids), n_prompt):
                        yield chunk
                    continue
                reason = _FINISH.get(c.finish_reason or "")
                if reason is None:  # "abort": aborted while this stream was being read
                    raise Aborted(f"request {job.request_id} was aborted by the server")
                if calls is not None:
                    events += calls.flush()
                    reason = finish_reason(reason, calls.calls)
                for chunk in chunks_of(events, len(c.token_ids), n_prompt, reason):
                    yield chunk
                return
            raise Aborted(f"request {job.request_id} ended without a finish")
        except VLLMClientError as e:
            raise InvalidInput(str(e)) from None
        finally:
            await stream.aclose()  # on early close, vLLM aborts the request here

    async def abort(self, request_id: str) -> None:
        if self.engine is not None:
            await self.engine.abort(request_id)

    @property
    def active_requests(self) -> int:
        return self.engine.get_num_unfinished_requests() if self.engine is not None else 0

    async def check_health(self) -> None:
        if self.engine is None:
            raise RuntimeError("engine not started")
        await self.engine.check_health()

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
