"""The race never draws an id its filters removed (issue: seed 5260's "Hi." sampled
codebook-0 id 2306, past the speech decoder's 2048 codes).

The Exp(1) noise was -log(u) with u = (k + 0.5) / 2**24 in float32: the top k rounded u
to 1.0, the noise to 0, and prob / noise to 0 / 0 = NaN at every removed id, which argmax
takes. Two guards, each tested alone: the noise keeps 23 bits so u < 1 (never 0), and the
race only looks at ids with prob > 0 (any noise). Both paths: sampling.py's torch
reference and the Triton kernel (Triton's interpreter on CPU; compiled, and inside a CUDA
graph, on a GPU)."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from voice_tts.engine import kernels
from voice_tts.engine.sampling import (
    NOISE_SHIFT,
    TALKER_STREAM,
    SamplingTensors,
    exp_from_bits,
    exp_noise,
    noise_bits,
    race,
    suppress_mask,
    talker_scores,
    warp,
    warp_and_sample,
)

V, EOS = 3072, 2150  # the talker's vocabulary: ids >= 2048 are control ids
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not kernels.AVAILABLE, reason="needs triton")


@functools.cache
def zero_noise_draws(want: int = 2, chunk: int = 4096) -> tuple[tuple[int, int], ...]:
    """(seed, id) of talker draws at frame 0 whose hashed bits are all ones in the top 24:
    the first noise (24 bits kept) was exactly 0 there. ~1 per 5,500 seeds."""
    found: list[tuple[int, int]] = []
    start = 0
    while len(found) < want:
        seed = torch.arange(start, start + chunk)
        bits = noise_bits(seed, torch.zeros_like(seed), torch.tensor([TALKER_STREAM]), V)
        rows, ids = torch.nonzero((bits[:, 0] >> 8) == (1 << 24) - 1, as_tuple=True)
        found += [(start + r, i) for r, i in zip(rows.tolist(), ids.tolist(), strict=True)]
        start += chunk
    return tuple(found[:want])


def talker_rows(n: int, gen_seed: int = 0) -> tuple[torch.Tensor, SamplingTensors]:
    """n rows of talker scores with the official defaults: 974 suppressed ids, top-k 50."""
    gen = torch.Generator().manual_seed(gen_seed)
    logits = torch.randn(n, V, generator=gen) * 3
    scores = talker_scores(logits, torch.zeros(n, V, dtype=torch.bool), torch.full((n,), 1.05),
                           torch.full((n,), 5), suppress_mask(V, EOS), EOS)
    params = SamplingTensors(do_sample=torch.ones(n, dtype=torch.bool),
                             temperature=torch.full((n,), 0.9),
                             top_k=torch.full((n,), 50), top_p=torch.ones(n))
    return scores, params


def test_noise_is_never_zero():
    top = torch.tensor([(1 << 32) - 1, (1 << 32) - (1 << NOISE_SHIFT), 0])
    noise = exp_from_bits(top)
    assert (noise > 0).all() and torch.isfinite(noise).all(), noise
    seeds, ids = zip(*zero_noise_draws(), strict=True)
    seed = torch.tensor(seeds)
    drawn = exp_noise(seed, torch.zeros_like(seed), torch.tensor([TALKER_STREAM]), V)[:, 0]
    assert (drawn[torch.arange(len(ids)), list(ids)] > 0).all()


def test_race_skips_removed_ids_under_zero_noise():
    """A zero noise at a removed id (prob 0) loses; at a kept id it wins (p / 0 = inf)."""
    prob = torch.tensor([[0.0, 0.7, 0.0, 0.3], [0.0, 0.7, 0.0, 0.3]])
    noise = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert race(prob, noise).tolist() == [1, 3]


def test_seeds_whose_noise_was_zero_draw_kept_ids():
    """Each draw whose first noise was 0 at some id: that id made the removed one (it is
    pushed below the top 50), and the race must still pick among the kept 50."""
    draws = zero_noise_draws()
    scores, params = talker_rows(len(draws))
    for row, (_, i) in enumerate(draws):
        scores[row, i] = scores[row].min() - 1 if i < 2048 else float("-inf")
    seed = torch.tensor([s for s, _ in draws])
    noise = exp_noise(seed, torch.zeros_like(seed), torch.tensor([TALKER_STREAM]), V)[:, 0]
    kept = torch.isfinite(warp(scores, params))
    tokens = warp_and_sample(scores, params, noise)
    assert kept[torch.arange(len(draws)), tokens].all(), tokens


def test_many_seeds_draw_only_kept_ids():
    """A property over 2,048 rows x 2 frames with the official defaults: every id the race
    picks survived the suppress mask and top-k."""
    scores, params = talker_rows(2048, gen_seed=1)
    kept = torch.isfinite(warp(scores, params))
    seed = torch.arange(2048) * 7919
    for frame in (0, 1):
        noise = exp_noise(seed, torch.full_like(seed, frame), torch.tensor([TALKER_STREAM]),
                          V)[:, 0]
        tokens = warp_and_sample(scores, params, noise)
        assert kept[torch.arange(2048), tokens].all()
        assert ((tokens < 2048) | (tokens == EOS)).all()  # a code, or the codec EOS


# --- the Triton kernel ----------------------------------------------------------------------


@pytest.fixture
def fused_path():
    with kernels.interpret_on_cpu() if DEVICE == "cpu" else contextlib.nullcontext():
        yield


def _kernel_args(n: int, seeds: list[int]):
    """Per-slot state of `kernels.sample` for n rows in slots 0..n-1, talker masks on."""
    params = SamplingTensors(do_sample=torch.ones(n, dtype=torch.bool, device=DEVICE),
                             temperature=torch.full((n,), 0.9, device=DEVICE),
                             top_k=torch.full((n,), 50, device=DEVICE),
                             top_p=torch.ones(n, device=DEVICE))
    masks = kernels.TalkerMasks(torch.zeros(n, V, dtype=torch.bool, device=DEVICE),
                                torch.full((n,), 1.05, device=DEVICE),
                                suppress_mask(V, EOS, DEVICE), EOS)
    slots = torch.arange(n, device=DEVICE)
    seed = torch.tensor(seeds, device=DEVICE)
    count = torch.full((n,), 5, device=DEVICE)  # past min_new_tokens; frame = 5 + offset
    return slots, params, seed, count, masks


@needs_triton
def test_kernel_seeds_whose_noise_was_zero_draw_kept_ids(fused_path):
    draws = zero_noise_draws()
    scores, _ = talker_rows(len(draws))
    logits = scores.clone()
    for row, (_, i) in enumerate(draws):
        logits[row, i] = logits[row][torch.isfinite(logits[row])].min() - 1
    logits = logits.nan_to_num(neginf=-1e4).to(DEVICE)  # the kernel applies the masks
    slots, params, seed, count, masks = _kernel_args(len(draws), [s for s, _ in draws])
    tokens = kernels.sample(logits, slots, params, seed, count, -5, TALKER_STREAM, masks)
    kept = torch.isfinite(warp(talker_scores(logits.cpu(), masks.seen.cpu(),
                                             masks.penalty.cpu(), count.cpu(),
                                             masks.suppress.cpu(), EOS),
                               talker_rows(len(draws))[1]))
    assert kept[torch.arange(len(draws)), tokens.cpu()].all(), tokens


@needs_triton
def test_kernel_race_skips_removed_ids_under_zero_noise(fused_path):
    """Zero noise at every removed id of every row; eagerly and (on a GPU) replayed from
    a CUDA graph, as the engine runs it."""
    n = 4
    scores, _ = talker_rows(n, gen_seed=2)
    logits = scores.nan_to_num(neginf=-1e4).to(DEVICE)
    slots, params, seed, count, masks = _kernel_args(n, [0, 1, 2, 3])
    kept = torch.isfinite(warp(scores, talker_rows(n)[1])).to(DEVICE)
    noise = torch.where(kept, torch.ones(n, V, device=DEVICE), torch.zeros(n, V, device=DEVICE))
    out = torch.empty(n, dtype=torch.long, device=DEVICE)

    def draw() -> torch.Tensor:
        return kernels.sample(logits, slots, params, seed, count, 0, TALKER_STREAM, masks,
                              out=out, noise=noise)

    assert kept[torch.arange(n, device=DEVICE), draw()].all(), out
    if DEVICE == "cuda":
        draw()  # compile before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            draw()
        out.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert kept[torch.arange(n, device=DEVICE), out].all(), out
