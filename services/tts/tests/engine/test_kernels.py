"""The fused Triton kernels of the decode path (engine/kernels) against the plain-PyTorch
modules they replace, in float32 on CPU through Triton's interpreter (tests/conftest.py
turns it on without CUDA; on a GPU the same tests run the compiled kernels). The
interpreter rounds bf16 by truncation and cannot multiply bf16 matrices, so bf16 is
checked on the GPU only (test_graphs_gpu.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from voice_tts.engine import Engine, EngineSettings, SamplingParams, kernels
from voice_tts.engine.model.layers import (
    MLP,
    Attention,
    DecoderLayer,
    KVCache,
    RMSNorm,
    causal_mask,
    rope_cos_sin,
    rope_inv_freq,
)
from voice_tts.engine.sampling import (
    SamplingTensors,
    exp_noise,
    suppress_mask,
    talker_scores,
    warp_and_sample,
)

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="needs triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def fused_path():
    with kernels.interpret_on_cpu() if DEVICE == "cpu" else contextlib.nullcontext():
        yield


def randn(*shape, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE)


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_equals_module(with_residual: bool) -> None:
    norm = RMSNorm(96, 1e-6).to(DEVICE)
    norm.weight.data = randn(96, seed=1)
    x, r = randn(3, 5, 96, seed=2), randn(3, 5, 96, seed=3)
    y, h = kernels.rms_norm(x, norm.weight, norm.eps, r if with_residual else None)
    ref_in = x + r if with_residual else x
    torch.testing.assert_close(h, ref_in, rtol=0, atol=0)
    torch.testing.assert_close(y, norm(ref_in), rtol=1e-6, atol=1e-6)


def test_fused_mlp_equals_module() -> None:
    mlp = MLP(64, 160).to(DEVICE)  # intermediate not a power of two: masked tail
    x = randn(4, 2, 64, seed=4)
    ref = mlp(x)
    mlp.fuse_projections()
    assert mlp.gate_proj.weight.data_ptr() == mlp.gate_up_weight.data_ptr()  # a view
    out = mlp.down_fused(kernels.linear(x, mlp.gate_up_weight))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_snake_beta_equals_module() -> None:
    from voice_tts.engine.model.speech_decoder import SnakeBeta

    snake = SnakeBeta(48).to(DEVICE)
    snake.alpha.data, snake.beta.data = randn(48, scale=0.5, seed=7), randn(48, seed=8)
    x = randn(3, 48, 1500, scale=2.0, seed=9)  # T over one block: masked tail
    with _reference_path():
        ref = snake(x)
    torch.testing.assert_close(kernels.snake_beta(x, snake.alpha, snake.beta), ref,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [1, 4])
def test_rope_cache_write_and_attention_equal_reference(t: int) -> None:
    """Rows in arbitrary slots at different offsets (a decode step, t=1, and a causal
    prefill, t=4): same q, same cache contents, same attention output."""
    b, heads, kv_heads, d = 3, 4, 2, 16
    attn = Attention(64, heads, kv_heads, d, 1e-6).to(DEVICE)
    for i, p in enumerate(attn.parameters()):
        p.data = randn(*p.shape, scale=0.3, seed=10 + i)
    ref_cache, cache = (KVCache(6, kv_heads, 32, d, torch.float32, DEVICE) for _ in range(2))
    for c in (ref_cache, cache):  # earlier keys of the slots, the same in both
        c.k.copy_(randn(*c.k.shape, seed=20))
        c.v.copy_(randn(*c.v.shape, seed=21))
    slots = torch.tensor([4, 1, 2], device=DEVICE)
    pos = (torch.arange(t)[None] + torch.tensor([[0], [3], [9]])).to(DEVICE)
    cos, sin = rope_cos_sin(rope_inv_freq(d, 1e6).to(DEVICE), pos, torch.float32)
    x = randn(b, t, 64, seed=5)

    q, k, v = attn.qkv(x, cos, sin)
    k_all, v_all = ref_cache.update(slots, pos, k, v, 32)
    ref = attn.attend(q, k_all, v_all, causal_mask(pos, 32))

    attn.fuse_projections()
    q_fused = kernels.qk_norm_rope_write(
        F.linear(x, attn.qkv_weight), attn.q_norm.weight, attn.k_norm.weight, 1e-6, cos, sin,
        cache.k, cache.v, slots, pos, heads)
    torch.testing.assert_close(q_fused.transpose(1, 2), q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache.v, ref_cache.v, rtol=0, atol=0)
    out = attn.o_proj(kernels.attention(q_fused, cache.k, cache.v, slots, pos, d ** -0.5))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("b", "t"), [(1, 2), (2, 1)])
def test_fused_layers_equal_modules(b: int, t: int) -> None:
    """Two decoder layers on the fused path (norms inside the GEMVs, the second with the
    residual add) at a prefill's rows (1 x 2) and a decode step's (2 x 1) equal the
    modules: the layer's output is its MLP output + the residual stream it returns."""
    layers = [DecoderLayer(64, 96, 4, 2, 16, 1e-6).to(DEVICE) for _ in range(2)]
    for i, p in enumerate(p for layer in layers for p in layer.parameters()):
        p.data = randn(*p.shape, scale=0.3, seed=40 + i)
    caches = [KVCache(4, 2, 32, 16, torch.float32, DEVICE) for _ in range(4)]
    slots = torch.tensor([2, 0][:b], device=DEVICE)
    pos = (torch.arange(t)[None] + torch.tensor([[5], [0]])[:b]).to(DEVICE)
    cos, sin = rope_cos_sin(rope_inv_freq(16, 1e6).to(DEVICE), pos, torch.float32)
    x = randn(b, t, 64, seed=6)
    ref = x
    for layer, cache in zip(layers, caches[:2], strict=True):
        ref = layer(ref, cos, sin, cache, slots, pos, causal_mask(pos, 32), 32)
    out, residual = x, None
    for layer, cache in zip(layers, caches[2:], strict=True):
        layer.fuse_projections()
        out, residual = layer.forward_fused(out, residual, cos, sin, cache, slots, pos)
    torch.testing.assert_close(out + residual, ref, rtol=1e-4, atol=1e-5)


def test_sample_equals_reference_processors_and_race() -> None:
    """Penalty, masks, temperature, top-k, top-p and the seeded race in one launch: the
    same tokens as sampling.py's sorts, rows read by slot with their own parameters."""
    n_slots, vocab, eos = 8, 3072, 2150
    rows = [(True, 0.9, 50, 1.0), (True, 0.7, vocab, 0.8), (False, 1.0, 50, 1.0),
            (True, 1.3, 10, 0.5), (True, 0.9, vocab, 0.95), (True, 1.0, 1, 1.0)]
    slots = torch.tensor([5, 0, 3, 7, 1, 2], device=DEVICE)
    params = SamplingTensors(
        do_sample=torch.zeros(n_slots, dtype=torch.bool, device=DEVICE),
        temperature=torch.ones(n_slots, device=DEVICE),
        top_k=torch.full((n_slots,), vocab, device=DEVICE),
        top_p=torch.ones(n_slots, device=DEVICE))
    for slot, (do, temp, k, p) in zip(slots.tolist(), rows, strict=True):
        params.do_sample[slot], params.temperature[slot] = do, temp
        params.top_k[slot], params.top_p[slot] = k, p
    seed = torch.randint(0, 2**32, (n_slots,), generator=torch.Generator().manual_seed(1))
    seed = seed.to(DEVICE)
    count = torch.tensor([0, 1, 5, 40, 2, 300, 7, 1], device=DEVICE)  # 0, 1: EOS masked
    masks = kernels.TalkerMasks(randn(n_slots, vocab, seed=6) > 1.2,
                                torch.full((n_slots,), 1.05, device=DEVICE),
                                suppress_mask(vocab, eos, DEVICE), eos)
    row_params = SamplingTensors(**{f: getattr(params, f)[slots] for f in vars(params)})
    for trial in range(3):
        logits = randn(len(rows), vocab, scale=3.0, seed=30 + trial)
        logits[:, eos] = 50.0  # EOS would win wherever it is not masked
        for talker in (False, True):
            stream, offset = (15, 0) if talker else (trial, -1)
            noise = exp_noise(seed[slots], count[slots] + offset,
                              torch.tensor([stream], device=DEVICE), vocab)[:, 0]
            scores = logits
            if talker:
                scores = talker_scores(logits, masks.seen[slots], masks.penalty[slots],
                                       count[slots], masks.suppress, eos)
            ref = warp_and_sample(scores, row_params, noise)
            out = kernels.sample(logits, slots, params, seed, count, offset, stream,
                                 masks if talker else None)
            assert out.tolist() == ref.tolist(), (talker, trial)
    assert out[1].item() != eos and out[2].item() == eos  # count 0 masks EOS; count 5 not


def _synthesize(sampling: SamplingParams, fused: bool) -> tuple[np.ndarray, np.ndarray]:
    ctx = contextlib.nullcontext() if fused else _reference_path()
    with ctx:
        engine = Engine.from_preset("tiny-1.7b", seed=0, device=DEVICE,
                                    settings=EngineSettings(max_sessions=2, cuda_graphs=False))
        assert engine.runner.fused == fused
        try:
            return engine.synthesize("Fused kernels, same speech.", "vivian", seed=3,
                                     sampling=sampling, max_frames=3, return_codes=True)
        finally:
            engine.shutdown()


@contextlib.contextmanager
def _reference_path():
    saved = kernels.active
    kernels.active = lambda x: False
    try:
        yield
    finally:
        kernels.active = saved


@pytest.mark.skipif(torch.cuda.is_available(), reason=(
    "bit-exact only under the interpreter, which follows the modules op for op; on CUDA the "
    "GEMMs differ (fused q|k|v, Triton attention): test_graphs_gpu.py gates that by SNR"))
@pytest.mark.parametrize("sampling", [SamplingParams.greedy(), SamplingParams(top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_fused_engine_equals_reference_engine(sampling: SamplingParams,
                                             monkeypatch) -> None:
    """The whole engine (talker and code predictor prefill + decode, both samplers) on the
    fused path gives the reference path's codes and audio. Its projections stay F.linear:
    the interpreter runs the GEMV's thousands of tiny programs one by one (minutes), and
    it sums in another order (test_gemv.py checks it; test_graphs_gpu.py in the engine)."""
    from voice_tts.engine.kernels import gemv

    monkeypatch.setattr(gemv, "MAX_ROWS", 0)
    pcm, codes = _synthesize(sampling, fused=True)
    ref_pcm, ref_codes = _synthesize(sampling, fused=False)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_allclose(pcm, ref_pcm, atol=1e-5)


def test_kernels_compile_for_hopper() -> None:
    """The interpreter does not type-check like the compiler: compile every kernel for
    sm_90 (no GPU needed) in a process with the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_kernels.py"))],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 18, proc.stdout


def test_prefill_graph_inputs_give_the_eager_prefill() -> None:
    """What a prefill graph replays (`PrefillGraphs.fn` on its padded (batch, length)
    input buffer, strided views included, and its extra-vector buffer: a clone's x-vector
    row) sets the same slot state and cache rows as the plain prefill of the same prompts.
    Run eagerly here: only the capture needs CUDA."""
    from voice_tts.engine.graphs import PrefillGraphs
    from voice_tts.engine.runner import PrefillRequest, PromptRows, prompt_rows

    engine = Engine.from_preset("tiny", seed=0, device=DEVICE, settings=EngineSettings(
        max_sessions=4, max_seq_len=64, cuda_graphs=False))
    r, t = engine.runner, engine.cfg.talker
    assert r.fused
    reqs = [(PrefillRequest(slot=slot, role_ids=[1, 2, 3], codec_prefix=[
        t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id], speaker_id=speaker,
        text_ids=[5 + slot], speaker_vec=vec), SamplingParams(top_k=5), 11 + slot)
        for slot, speaker, vec in ((0, None, torch.randn(t.hidden_size, device=DEVICE)),
                                   (2, 3, None))]
    fields = ("last_token", "past_hidden", "position", "n_generated", "seen")

    def state() -> dict[str, torch.Tensor]:
        s = r.state
        out = {f: getattr(s, f)[[0, 2]].clone() for f in fields}
        out["keys"] = r.model.talker.caches[-1].k[[0, 2], :, :9].clone()
        return out

    lengths = r.prefill(reqs)
    assert lengths == [9, 9]  # a speaker row each: rows past `last` are padding
    ref = state()
    for f in fields:  # scramble, so that the graph's work must set everything again
        getattr(r.state, f)[[0, 2]] = getattr(r.state, f)[[1, 3]]
    r.model.talker.caches[-1].k[[0, 2]] = 0
    graphs = PrefillGraphs(r, [4], [16], None)
    rows = [PromptRows(p.text + [-1] * (16 - len(p.text)), p.codec + [-1] * (16 - len(p.codec)),
                       p.extra) for p in (prompt_rows(engine.cfg, req) for req, _, _ in reqs)]
    buf = graphs.inputs(4, [0, 2], rows, [n - 1 for n in lengths]).to(DEVICE)
    with torch.no_grad():
        r.extra_rows(rows, 16, out=graphs.extra(4, 16))
        graphs.fn(buf, 16)()
    out = state()
    for f in ("last_token", "position", "n_generated", "seen"):
        assert torch.equal(out[f], ref[f]), f
    torch.testing.assert_close(out["past_hidden"], ref["past_hidden"])
    torch.testing.assert_close(out["keys"], ref["keys"])
    engine.shutdown()
