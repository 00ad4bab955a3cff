"""The Transformers backend: HF `generate` in worker threads, streamed into asyncio.

One thread per request runs `model.generate` (torch releases the GIL, so requests overlap
on CPU); a streamer hands each new token id to the event loop (the TextIteratorStreamer
pattern, but into an asyncio queue), where it is detokenized and checked for stop strings.

Cancellation is real: every request carries a threading.Event that a StoppingCriteria
reads after each decode step, so `abort` (or closing the stream) ends `generate` after at
most the step in progress. `steps_run(request_id)` exposes the step count so tests can see
generation stop rather than assume it.

Sampling runs in a logits processor with a per-request torch.Generator, so a request's
`seed` gives the same reply even while other requests sample concurrently (HF's own
sampler draws from the global RNG). Audio is not taken: the model is text-only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice_llm.backends.base import (
    chat_template_messages,
    check_prompt_len,
    render_prompt,
    warmup_job,
)
from voice_llm.backends.text import IncrementalDetokenizer, StopMatcher
from voice_llm.chat import ChatJob, Chunk, FinishReason, SamplingOptions
from voice_llm.errors import Aborted, InvalidInput, is_device_fault
from voice_llm.settings import Settings
from voice_llm.tiny_random import RANDOM_MARKER

log = logging.getLogger(__name__)
_END = object()


@dataclass
class _Run:
    """One request's generation thread, as the event loop sees it."""

    cancel: threading.Event = field(default_factory=threading.Event)
    steps: int = 0  # decode steps taken (read by tests and abort logging)
    done: threading.Event = field(default_factory=threading.Event)


class TransformersBackend:
    name = "transformers"
    accepts_audio = False

    def __init__(self, settings: Settings, model_path: Path) -> None:
        self._settings = settings
        self._path = model_path
        self._pool = ThreadPoolExecutor(settings.max_concurrent, thread_name_prefix="hf-gen")
        self._runs: dict[str, _Run] = {}
        self._finished_steps: dict[str, int] = {}
        self.tokenizer: Any = None
        self.model: Any = None
        self._eos: set[int] = set()
        self._allowed: Any = None  # bool tensor over the LM head, None: every id
        # A device fault (errors.is_device_fault) seen by a generation, and who to tell.
        self.fault: BaseException | None = None
        self.on_fault: Callable[[BaseException], None] | None = None

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load)
        async for _ in self.generate(warmup_job()):
            pass

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._settings.torch_threads:
            torch.set_num_threads(self._settings.torch_threads)
        dtype = "auto" if self._settings.dtype == "auto" else getattr(torch, self._settings.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self._path)
        if (self._path / RANDOM_MARKER).exists():  # random:<shape>: weights made here
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self._path)
            torch.manual_seed(0)
            with torch.device(self._settings.device):
                self.model = AutoModelForCausalLM.from_config(
                    config, dtype=torch.bfloat16 if dtype == "auto" else dtype)
            log.warning("LLM_MODEL=%s: RANDOM WEIGHTS at a real shape (benchmarks only)",
                        self._settings.model)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(self._path, dtype=dtype)
        self.model.to(self._settings.device).eval()
        eos = self.model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self._eos.add(self.tokenizer.eos_token_id)
        self._allowed = self._allowed_ids((self._path / RANDOM_MARKER).exists())
        log.info("transformers model loaded from %s on %s", self._path, self._settings.device)

    def _allowed_ids(self, random_weights: bool) -> Any:
        """Ids past the tokenizer's (a padded LM head, as in Qwen's 151936 vs 151669)
        decode to nothing: never sampled. Random weights also never sample a token that
        is not text on its own (byte fragments, control characters, special tokens but
        the end): a real model writes text, and the agent downstream (bridge, TTS) should
        get word salad to speak, not bytes that decode to nothing. (On the H100 the random
        Qwen3-1.7B's first speakable text came 0.4-1.7 s after its first token.)"""
        import torch

        n_vocab, size = len(self.tokenizer), self.model.config.vocab_size
        if size <= n_vocab and not random_weights:
            return None
        allowed = torch.zeros(size, dtype=torch.bool)
        allowed[:n_vocab] = True
        if random_weights:
            special = set(self.tokenizer.all_special_ids) - self._eos
            for i in range(n_vocab):
                text = self.tokenizer.decode([i])
                allowed[i] = i in self._eos or (
                    i not in special and text.strip() != "" and text.isprintable()
                    and "\ufffd" not in text)
        return allowed.to(self.model.device)

    async def generate(self, job: ChatJob) -> AsyncIterator[Chunk]:
        if job.has_audio:
            raise AssertionError("audio reached the transformers backend")
        messages, _ = chat_template_messages(job.messages)
        prompt_ids = self.tokenizer(render_prompt(self.tokenizer, messages)).input_ids
        n_prompt = len(prompt_ids)
        check_prompt_len(n_prompt, self._settings.max_model_len)
        max_new = min(job.options.max_tokens, self._settings.max_model_len - n_prompt)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        run = _Run()
        if job.request_id in self._runs:
            raise InvalidInput(f"request_id {job.request_id!r} is already generating")
        self._runs[job.request_id] = run
        future = loop.run_in_executor(
            self._pool, self._generate_blocking, prompt_ids, max_new, job.options, run, loop, queue
        )
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopMatcher(job.options.stop)
        last_id, finished = -1, False
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                last_id = item[-1]
                text = stops.feed(detok.push(item))
                if stops.matched:
                    run.cancel.set()  # the engine may be a step ahead: stop it now
                    await future
                    finished = True
                    yield Chunk(text, len(item), n_prompt, finish=FinishReason.STOP)
                    return
                yield Chunk(text, len(item), n_prompt)
            await future
            if run.cancel.is_set():
                raise Aborted(f"request {job.request_id} was aborted by the server")
            tail = stops.feed(detok.flush()) + stops.flush()
            eos = last_id in self._eos
            reason = FinishReason.STOP if eos or stops.matched else FinishReason.LENGTH
            finished = True
            yield Chunk(tail, 0, n_prompt, finish=reason)
        finally:
            if not finished:
                run.cancel.set()  # closed early: the caller was cancelled or failed

    def _generate_blocking(
        self,
        prompt_ids: list[int],
        max_new: int,
        options: SamplingOptions,
        run: _Run,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[Any],
    ) -> None:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from voice_llm.backends.hf_hooks import (
            AllowedIds,
            CancelOnEvent,
            QueueStreamer,
            SeededSampler,
        )

        try:
            ids = torch.tensor([prompt_ids], device=self.model.device)
            processors = LogitsProcessorList()
            if self._allowed is not None:
                processors.append(AllowedIds(self._allowed))
            if options.temperature > 0:
                processors.append(SeededSampler(options, self.model.device))
            with torch.inference_mode():
                self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new,
                    do_sample=False,  # SeededSampler does the sampling
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([CancelOnEvent(run)]),
                    streamer=QueueStreamer(loop, queue),
                    eos_token_id=sorted(self._eos),
                    pad_token_id=self.tokenizer.pad_token_id,
                )
        except BaseException as e:
            if is_device_fault(e) and self.fault is None:
                self.fault = e  # the CUDA context is gone: the server exits (server.py)
                if self.on_fault is not None:
                    loop.call_soon_threadsafe(self.on_fault, e)
            loop.call_soon_threadsafe(queue.put_nowait, e)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _END)
            run.done.set()
            loop.call_soon_threadsafe(self._forget, run)

    def _forget(self, run: _Run) -> None:
        for rid, r in list(self._runs.items()):
            if r is run:
                del self._runs[rid]
                self._finished_steps[rid] = r.steps
                while len(self._finished_steps) > 256:
                    self._finished_steps.pop(next(iter(self._finished_steps)))

    async def abort(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is not None:
            run.cancel.set()

    def steps_run(self, request_id: str) -> tuple[int, bool]:
        """(decode steps taken, whether the generation thread has ended) for a request."""
        run = self._runs.get(request_id)
        if run is not None:
            return run.steps, run.done.is_set()
        return self._finished_steps.get(request_id, 0), True

    @property
    def active_requests(self) -> int:
        return len(self._runs)

    async def check_health(self) -> None:
        if self.model is None:
            raise RuntimeError("model not loaded")
        if self.fault is not None:
            raise RuntimeError(f"device fault: {str(self.fault)[:200]}")

    async def close(self) -> None:
        for run in self._runs.values():
            run.cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
