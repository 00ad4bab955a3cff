"""The batched decode equals HF `generate`, token for token, whoever shares the steps.

The model is the tiny random Qwen3 in float32; greedy replies of requests batched together
(different prompt lengths, so rows sit at different positions; one joining mid-flight, so
rows are prefilled between decode steps) must be exactly what `generate` makes for each
prompt alone. Run on CUDA (bench/gpu.sh's GPU tests) it checks the captured graphs too.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from voice_llm.backends.batcher import END, Batcher, Request, buckets
from voice_llm.chat import SamplingOptions

GREEDY = SamplingOptions(max_tokens=0, temperature=0.0, top_p=1.0, seed=None)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model_and_tokenizer(cache_dir: Path):
    path = cache_dir / "tiny-random-qwen3-v1"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="sdpa").to(DEVICE).eval()
    return model, AutoTokenizer.from_pretrained(path)


def reference(model, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt], device=model.device),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


class Collect:
    """A request's emitted tokens, as the batcher's thread hands them over."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.items: queue.Queue = queue.Queue()
        self.first = threading.Event()

    def emit(self, item) -> None:
        if isinstance(item, list):
            self.tokens += item
            self.first.set()
        self.items.put(item)

    def wait_end(self) -> None:
        while self.items.get(timeout=60) is not END:
            pass


def test_buckets() -> None:
    assert buckets(8, 1) == [1, 2, 4, 8]
    assert buckets(6, 1) == [1, 2, 4, 6]
    assert buckets(2048, 128) == [128, 256, 512, 1024, 2048]
    assert buckets(100, 128) == [100]


def test_batched_greedy_equals_generate_alone(model_and_tokenizer) -> None:
    model, tok = model_and_tokenizer
    prompts = [tok(t).input_ids for t in
               ("Hello!", "The weather is nice, let us go for a walk in the park today.",
                "Numbers: one two three", "你好，今天天气很好")]
    n = 24
    batcher = Batcher(model, slots=4, max_len=256, eos=set(), allowed=None,
                      graphs=DEVICE == "cuda")
    try:
        got = [Collect() for _ in prompts]
        for p, c in zip(prompts[:3], got, strict=False):
            batcher.submit(Request(p, n, GREEDY, c.emit))
        got[0].first.wait(30)
        while len(got[0].tokens) < 5:  # the fourth joins while the others decode
            threading.Event().wait(0.001)
        batcher.submit(Request(prompts[3], n, GREEDY, got[3].emit))
        for c in got:
            c.wait_end()
    finally:
        batcher.close()
    for p, c in zip(prompts, got, strict=True):
        assert c.tokens == reference(model, p, n)


def test_a_cancelled_request_leaves_the_batch_and_frees_its_slot(model_and_tokenizer) -> None:
    model, tok = model_and_tokenizer
    batcher = Batcher(model, slots=1, max_len=512, eos=set(), allowed=None, graphs=False)
    try:
        first, second = Collect(), Collect()
        long = Request(tok("Talk.").input_ids, 400, GREEDY, first.emit)
        batcher.submit(long)
        batcher.submit(Request(tok("Hi").input_ids, 3, GREEDY, second.emit))  # waits for a slot
        first.first.wait(30)
        long.cancel.set()
        batcher.wake()
        first.wait_end()
        assert long.done.is_set() and long.steps < 400
        second.wait_end()  # the one slot went to the waiting request
        assert len(second.tokens) == 3
    finally:
        batcher.close()
