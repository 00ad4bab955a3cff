"""The batched decode equals HF `generate`, token for token, whoever shares the steps.

The model is the tiny random Qwen3 in float32; greedy replies of requests batched together
(different prompt lengths, prefilled together right-padded, so rows sit at different
positions; one joining mid-flight, so rows are prefilled between decode steps) must be
exactly what `generate` makes for each prompt alone. Run on CUDA it checks the captured
graphs too.
"""

from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from voice_llm.backends.batcher import END, Batcher, Request, buckets
from voice_llm.chat import SamplingOptions
from voice_llm.tiny_random import model_dir

GREEDY = SamplingOptions(max_tokens=0, temperature=0.0, top_p=1.0, seed=None)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model_and_tokenizer(cache_dir: Path):
    path = model_dir(cache_dir)
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
    prefills: list[int] = []
    prefill = batcher._prefill
    batcher._prefill = lambda reqs: (prefills.append(len(reqs)), prefill(reqs))[1]
    try:
        got = [Collect() for _ in prompts]
        with batcher._cond:  # the loop takes the three together: one padded prefill
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
    assert prefills == [3, 1]
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


def test_non_finite_logits_fail_the_row_not_the_device() -> None:
    """A NaN row gets an error instead of a token (multinomial would trip a device-side
    assert on CUDA, which poisons the process's context); the other rows still sample."""
    from voice_llm.backends.sampling import NonFiniteLogits, pick

    logits = torch.randn(3, 50)
    logits[1, 7] = float("nan")
    sampled = SamplingOptions(max_tokens=0, temperature=0.8, top_p=0.9, seed=1)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    got = pick(logits, [GREEDY, sampled, sampled], [None, gens[1], gens[2]], None)
    assert got[0] == int(logits[0].argmax())
    assert isinstance(got[1], NonFiniteLogits)
    assert isinstance(got[2], int) and 0 <= got[2] < 50


def test_the_race_never_picks_a_dropped_id_even_under_zero_noise() -> None:
    """A noise of exactly 0 at an id top-p or `allowed` dropped (p 0) must not make it
    win through 0 / 0 = NaN; at a kept id it wins (p / 0 = inf), as a draw may."""
    from voice_llm.backends.sampling import race

    probs = torch.tensor([[0.0, 0.6, 0.4, 0.0], [0.0, 0.6, 0.4, 0.0]])
    noise = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    assert race(probs, noise).tolist() == [1, 2]


def test_a_model_gone_nan_fails_its_requests_with_a_clear_error(model_and_tokenizer) -> None:
    model, tok = model_and_tokenizer
    forward = model.forward

    def nan_forward(*args, **kw):
        out = forward(*args, **kw)
        out.logits = out.logits * float("nan")
        return out

    batcher = Batcher(model, slots=2, max_len=256, eos=set(), allowed=None, graphs=False)
    try:
        model.forward = nan_forward
        c = Collect()
        batcher.submit(Request(tok("Hi").input_ids, 5, GREEDY, c.emit))
        items = [c.items.get(timeout=30), c.items.get(timeout=30)]
        assert "not finite" in str(items[0]) and items[1] is END and not c.tokens
        del model.forward  # healthy again: the batcher still serves
        ok = Collect()
        batcher.submit(Request(tok("Hi").input_ids, 5, GREEDY, ok.emit))
        ok.wait_end()
        assert len(ok.tokens) == 5
    finally:
        model.__dict__.pop("forward", None)
        batcher.close()


def test_pacing_slows_steps_after_the_first_tokens_but_not_a_new_request(
        model_and_tokenizer) -> None:
    model, tok = model_and_tokenizer
    batcher = Batcher(model, slots=2, max_len=256, eos=set(), allowed=None, graphs=False,
                      pace_tokens_per_s=20, pace_after_tokens=4)
    try:
        stamps: list[float] = []
        first = Collect()

        def emit(item) -> None:
            stamps.append(time.monotonic())
            first.emit(item)

        batcher.submit(Request(tok("Talk.").input_ids, 12, GREEDY, emit))
        while len(first.tokens) < 8:
            time.sleep(0.005)
        second, asked = Collect(), time.monotonic()
        batcher.submit(Request(tok("Hi").input_ids, 2, GREEDY, second.emit))
        second.first.wait(5)
        joined = time.monotonic() - asked
        first.wait_end()
        second.wait_end()
    finally:
        batcher.close()
    gaps = [b - a for a, b in itertools.pairwise(stamps[4:12])]
    assert statistics.median(gaps) > 0.035, gaps  # ~50 ms a step once past the first 4
    assert stamps[3] - stamps[0] < 0.1  # the first tokens at full speed
    assert joined < 0.04, joined  # a new request does not wait out the pace
