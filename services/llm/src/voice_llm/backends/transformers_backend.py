"""The Transformers backend: an HF decoder, batched continuously, streamed into asyncio.

The model runs in one thread (`batcher.Batcher`): every request in flight advances by one
token per forward (on CUDA a captured graph per batch bucket). Each new token id reaches
the event loop through the request's queue, where it is detokenized and checked for stop
strings.

Cancellation is real: a request's cancel flag drops it from the batch before the next
step, so `abort` (or closing the stream) ends its work after at most the step in
progress. `steps_run(request_id)` exposes the forwards it took part in so tests can see
generation stop rather than assume it.

Sampling uses a per-request torch.Generator, so a request's `seed` gives the same reply
whoever shares its steps.

Audio goes in as audio when the model is an omni thinker (Qwen2.5-Omni's: omni.py makes
its features, placeholder tokens and M-RoPE positions; the batcher encodes it in the
prefill); a text model takes none (`accepts_audio` false: the service transcribes or
refuses).

Tools (backends/tools.py): rendered by the chat template; calls are parsed out of the
streamed text; REQUIRED / a named function masks each step's logits with the call's
grammar (xgrammar), so the reply is one schema-valid call whatever the weights.
"""

from __future__ import annotations

import asyncio
import json
import logging
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
from voice_llm.backends.batcher import END, Batcher, Request
from voice_llm.backends.omni import OMNI_THINKERS, OmniThinker, is_omni_thinker, thinker_class
from voice_llm.backends.text import IncrementalDetokenizer, StopMatcher
from voice_llm.backends.tools import (
    Grammars,
    ToolCallParser,
    chunks_of,
    finish_reason,
    template_tools,
)
from voice_llm.chat import ChatJob, Chunk, FinishReason
from voice_llm.errors import Aborted, InvalidInput
from voice_llm.settings import Settings
from voice_llm.tiny_random import RANDOM_MARKER

log = logging.getLogger(__name__)


class TransformersBackend:
    name = "transformers"

    def __init__(self, settings: Settings, model_path: Path) -> None:
        self._settings = settings
        self._path = model_path
        self.accepts_audio = _model_type(model_path) in OMNI_THINKERS
        self._omni: OmniThinker | None = None
        self._runs: dict[str, Request] = {}
        self._finished_steps: dict[str, int] = {}
        self.tokenizer: Any = None
        self.model: Any = None
        self._batcher: Batcher | None = None
        self._eos: set[int] = set()
        # A device fault (errors.is_device_fault) seen by a generation, and who to tell.
        self.fault: BaseException | None = None
        self.on_fault: Callable[[BaseException], None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._load)
        self._batcher.on_fault = lambda e: loop.call_soon_threadsafe(self._faulted, e)
        async for _ in self.generate(warmup_job()):
            pass

    def _faulted(self, e: BaseException) -> None:
        if self.fault is None:
            self.fault = e  # the CUDA context is gone: the server exits (server.py)
            if self.on_fault is not None:
                self.on_fault(e)

    def _load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if self._settings.torch_threads:
            torch.set_num_threads(self._settings.torch_threads)
        dtype = "auto" if self._settings.dtype == "auto" else getattr(torch, self._settings.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self._path)
        self._plain = PlainText(self.tokenizer)
        random_weights = (self._path / RANDOM_MARKER).exists()
        config = AutoConfig.from_pretrained(self._path)
        omni = is_omni_thinker(config)
        if random_weights:  # random:<shape>: weights made here
            torch.manual_seed(0)
            with torch.device(self._settings.device):
                kw = dict(dtype=torch.bfloat16 if dtype == "auto" else dtype,
                          attn_implementation="sdpa")
                self.model = (thinker_class(config)._from_config(config, **kw) if omni
                              else AutoModelForCausalLM.from_config(config, **kw))
            log.warning("LLM_MODEL=%s: RANDOM WEIGHTS at a real shape (benchmarks only)",
                        self._settings.model)
        else:
            cls = thinker_class(config) if omni else AutoModelForCausalLM
            self.model = cls.from_pretrained(self._path, dtype=dtype, attn_implementation="sdpa")
        self.model.to(self._settings.device).eval()
        cuda = self.model.device.type == "cuda"
        if cuda:
            # SDPA's cuDNN kernel builds a graph per new shape (~1.6 ms of CPU a layer), and
            # the prefill's shape is new each request: on the H100 a random Qwen3-1.7B
            # decoded at 89 ms a token with it, 23 without (flash / mem-efficient instead).
            torch.backends.cuda.enable_cudnn_sdp(False)
        eos = self.model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self._eos.add(self.tokenizer.eos_token_id)
        vocab_size = self.model.config.get_text_config().vocab_size
        self._grammars = Grammars(self.tokenizer, vocab_size, self._eos)
        if omni:
            self._omni = OmniThinker(self.model, self.tokenizer)
        self._batcher = Batcher(self._omni or self.model, self._settings.max_concurrent,
                                self._settings.max_model_len, self._eos,
                                self._allowed_ids(random_weights), graphs=cuda,
                                pace_tokens_per_s=self._settings.pace_tokens_per_s,
                                pace_after_tokens=self._settings.pace_after_tokens)
        log.info("transformers model loaded from %s on %s (%d slots of %d tokens: %.2f GB "
                 "of KV cache)", self._path, self._settings.device,
                 self._settings.max_concurrent, self._settings.max_model_len,
                 self._batcher.cache.nbytes / 1e9)

    def _allowed_ids(self, random_weights: bool) -> Any:
        """Ids past the tokenizer's (a padded LM head, as in Qwen's 151936 vs 151669)
        decode to nothing: never sampled. Random weights also never sample a token that
        is not text on its own (byte fragments, control characters, special tokens but
        the end): a real model writes text, and the agent downstream (bridge, TTS) should
        get word salad to speak, not bytes that decode to nothing. (On the H100 the random
        Qwen3-1.7B's first speakable text came 0.4-1.7 s after its first token.)"""
        import torch

        n_vocab, size = len(self.tokenizer), self.model.config.get_text_config().vocab_size
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
        messages, clips = chat_template_messages(job.messages, self._plain)
        tools = job.active_tools
        prompt = render_prompt(self.tokenizer, messages, template_tools(tools))
        audio = None
        if clips:
            assert self._omni is not None, "audio reached a model that cannot hear"
            prompt = prompt.replace(AUDIO_SENTINEL, self._omni.placeholder)
            prompt_ids, audio = await asyncio.to_thread(
                self._omni.prepare, clips, self.tokenizer(prompt).input_ids)
        else:
            prompt_ids = self.tokenizer(prompt).input_ids
        n_prompt = len(prompt_ids)
        check_prompt_len(n_prompt, self._settings.max_model_len)
        max_new = min(job.options.max_tokens, self._settings.max_model_len - n_prompt)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        if job.request_id in self._runs:
            raise InvalidInput(f"request_id {job.request_id!r} is already generating")

        def deliver(item: Any) -> None:  # on the loop
            if item is END:  # forgotten before the reader sees the end (its id is free)
                self._forget(run)
            queue.put_nowait(item)

        def emit(item: Any) -> None:  # from the batcher's thread
            loop.call_soon_threadsafe(deliver, item)

        constraint = (await asyncio.to_thread(self._grammars.constraint, job)
                      if job.tool_choice.constrained else None)
        run = Request(prompt_ids, max_new, job.options, emit, constraint=constraint,
                      audio=audio)
        self._batcher.submit(run)  # raises once closed; its END reaches _forget after this:
        self._runs[job.request_id] = run  # the loop runs emit's callbacks at the next await
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopMatcher(job.options.stop)
        calls = ToolCallParser([t.name for t in tools]) if tools else None
        last_id, finished = -1, False
        try:
            while True:
                item = await queue.get()
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                last_id = item[-1]
                text = stops.feed(detok.push(item))
                if stops.matched:
                    self._cancel(run)  # the batcher may be a step ahead: stop it now
                    finished = True
                    events = [text] if calls is None else calls.feed(text) + calls.flush()
                    reason = finish_reason(FinishReason.STOP, calls.calls if calls else 0)
                    for chunk in chunks_of(events, len(item), n_prompt, reason):
                        yield chunk
                    return
                for chunk in chunks_of([text] if calls is None else calls.feed(text),
                                       len(item), n_prompt):
                    yield chunk
            if run.cancel.is_set():
                raise Aborted(f"request {job.request_id} was aborted by the server")
            tail = stops.feed(detok.flush()) + stops.flush()
            events = [tail] if calls is None else calls.feed(tail) + calls.flush()
            eos = last_id in self._eos
            reason = FinishReason.STOP if eos or stops.matched else FinishReason.LENGTH
            reason = finish_reason(reason, calls.calls if calls else 0)
            finished = True
            for chunk in chunks_of(events, 0, n_prompt, reason):
                yield chunk
        finally:
            if not finished:
                self._cancel(run)  # closed early: the caller was cancelled or failed

    def _cancel(self, run: Request) -> None:
        run.cancel.set()
        self._batcher.wake()

    def _forget(self, run: Request) -> None:
        for rid, r in list(self._runs.items()):
            if r is run:
                del self._runs[rid]
                self._finished_steps[rid] = r.steps
                while len(self._finished_steps) > 256:
                    self._finished_steps.pop(next(iter(self._finished_steps)))

    async def abort(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is not None:
            self._cancel(run)

    def steps_run(self, request_id: str) -> tuple[int, bool]:
        """(forwards taken, whether the batcher is done with it) for a request."""
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
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.close)


def _model_type(model_path: Path) -> str | None:
    """The checkpoint's model_type, read before the model loads (`accepts_audio` is asked
    as soon as the server starts)."""
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
