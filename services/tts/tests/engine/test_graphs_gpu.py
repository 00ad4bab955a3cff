"""GPU only (skipped without CUDA; run on the device, `WITH_TESTS=1 bash bench/gpu.sh`): the
Triton cache attention equals SDPA, the fused kernels round like the modules in bf16 and
keep the reference's codes in float32, the CUDA-graph prefill and decode step equal eager
(the decoder on its own stream included: a slot reused mid-step starts clean), with and
without programmatic dependent launch, batched equals solo (a call arriving beside a running
one, its first step apart, included), and 1,000 sessions leak no GPU memory."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from voice_tts.engine import Engine, EngineSettings, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "你好，欢迎使用语音合成服务。",
         "Streaming speech, one frame at a time.", "A fourth voice joins the batch."]
PRESET = "0.6b"


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    n = min(len(ref), len(out))
    ref, out = ref[:n].astype(np.float64), out[:n].astype(np.float64)
    return 10 * np.log10(np.sum(ref**2) / max(np.sum((ref - out) ** 2), 1e-30))


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    out = {}
    for graphs in (False, True):
        e = Engine.from_preset(PRESET, seed=0, device="cuda", settings=EngineSettings(
            max_sessions=8, max_batch=8, max_seq_len=512, cuda_graphs=graphs,
            decoder_precision="fp32"))
        e.start()
        out["graph" if graphs else "eager"] = e
    yield out
    for e in out.values():
        e.shutdown()


def run(engine: Engine, texts: list[str], greedy: bool, codes: bool = False,
        voices: list[str] | None = None) -> list[np.ndarray]:
    """Each text's audio (or with `codes`, its codec codes (frames, 16)), in `voices`
    (default vivian)."""
    from voice_tts.engine import AudioPacket, SessionParams, UtteranceEnd

    outs: list[list[np.ndarray]] = [[] for _ in texts]
    done = [threading.Event() for _ in texts]

    def sink(i):
        def f(item):
            if isinstance(item, AudioPacket):
                outs[i].append(item.codes if codes else item.pcm)
            elif isinstance(item, UtteranceEnd):
                done[i].set()
        return f

    sampling = SamplingParams.greedy() if greedy else SamplingParams()
    voices = voices or ["vivian"] * len(texts)
    sessions = [engine.open_session(SessionParams(voice=voices[i], seed=7 + i,
                                                  sampling=sampling, max_frames=40), sink(i))
                for i in range(len(texts))]
    for s, t in zip(sessions, texts, strict=True):
        s.push_text(t)
        s.flush()
    for d in done:
        assert d.wait(120)
    for s in sessions:
        s.close()
    return [np.concatenate(o) for o in outs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_attention_equals_sdpa(dtype) -> None:
    from voice_tts.engine.kernels import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    s, kvh, h, length, d, b = 9, 8, 16, 300, 128, 5
    kc = torch.randn(s, kvh, length, d, device="cuda", generator=g).to(dtype)
    vc = torch.randn(s, kvh, length, d, device="cuda", generator=g).to(dtype)
    q = torch.randn(b, 1, h, d, device="cuda", generator=g).to(dtype)
    slots = torch.tensor([3, 0, 8, 3, 5], device="cuda")
    lengths = torch.tensor([1, 17, 64, 300, 129], device="cuda")
    out = attention(q, kc, vc, slots, (lengths - 1)[:, None], d ** -0.5)
    out = out.view(b, h, d).double()
    for i in range(b):
        n, sl = int(lengths[i]), int(slots[i])
        k = kc[sl, :, :n].double().repeat_interleave(h // kvh, 0)
        v = vc[sl, :, :n].double().repeat_interleave(h // kvh, 0)
        ref = torch.softmax(q[i, 0].double()[:, None] @ k.transpose(1, 2) * d ** -0.5,
                            -1) @ v  # (H, 1, D)
        err = (out[i] - ref[:, 0]).norm() / ref.norm()
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"row {i}: {err:.2e}"


def test_fused_bf16_ops_round_like_the_modules() -> None:
    """bf16 (which Triton's CPU interpreter cannot check): the fused norm and MLP give the
    modules' values up to one bf16 rounding step of the float32 sums."""
    from voice_tts.engine import kernels
    from voice_tts.engine.model.layers import MLP, RMSNorm

    g = torch.Generator(device="cuda").manual_seed(0)
    norm = RMSNorm(1024, 1e-6).cuda().bfloat16()
    norm.weight.data = torch.randn(1024, device="cuda", generator=g).bfloat16()
    x, r = (torch.randn(64, 1024, device="cuda", generator=g).bfloat16() for _ in range(2))
    y, h = kernels.rms_norm(x, norm.weight, norm.eps, r)
    assert torch.equal(h, x + r)
    ref = norm(x + r).float()
    assert ((y.float() - ref).abs() <= ref.abs() * 2**-7 + 1e-6).float().mean() == 1
    assert (y == norm(x + r)).float().mean() > 0.99
    mlp = MLP(1024, 3072).cuda().bfloat16()
    ref = mlp(y)
    mlp.fuse_projections()
    out = mlp.down_fused(kernels.linear(y, mlp.gate_up_weight))
    assert (out - ref).float().norm() / ref.float().norm() < 1e-2


def test_fused_engine_equals_reference_float32(monkeypatch) -> None:
    """The real 0.6B shapes in float32: the fused path keeps the reference's greedy codes."""
    from voice_tts.engine import kernels

    def engine() -> Engine:
        e = Engine.from_preset(PRESET, seed=0, device="cuda", dtype=torch.float32,
                               settings=EngineSettings(max_sessions=2, max_batch=2,
                                                       max_seq_len=512, cuda_graphs=False,
                                                       decoder_precision="fp32"))
        e.start()
        return e

    fused = engine()
    assert fused.runner.fused
    try:
        out = run(fused, TEXTS[:2], greedy=True)
    finally:
        fused.shutdown()
    monkeypatch.setattr(kernels, "active", lambda x: False)
    ref_engine = engine()
    assert not ref_engine.runner.fused
    try:
        ref = run(ref_engine, TEXTS[:2], greedy=True)
    finally:
        ref_engine.shutdown()
    for a, b in zip(out, ref, strict=True):
        assert len(a) == len(b)
        assert snr_db(b, a) >= 60, f"SNR {snr_db(b, a):.1f} dB"


def test_graphs_equal_eager(engines) -> None:
    eager = run(engines["eager"], TEXTS, greedy=True)
    graph = run(engines["graph"], TEXTS, greedy=True)
    assert engines["graph"].runner.prefill_graphs.replays > 0  # prompts ran as graphs too
    # Every bucket was timed at warm-up (admission's baseline), on scratch rows only:
    # the outputs above still equal the eager engine's.
    steps = engines["graph"].bucket_step_ms
    assert sorted(steps) == [1, 2, 4, 8] and all(0 < ms < 1000 for ms in steps.values())
    assert engines["eager"].bucket_step_ms == {}
    for a, b in zip(eager, graph, strict=True):
        assert len(a) == len(b)
        assert snr_db(a, b) >= 60, f"SNR {snr_db(a, b):.1f} dB"


def test_programmatic_dependent_launch_changes_no_code(engines, monkeypatch) -> None:
    """PDL lets each kernel launch before the previous one ends: a kernel that touched step
    data before its wait would read stale values. The graphed engine without PDL samples
    the same codes, session by session (one at a time: the same batch shapes)."""
    from voice_tts.engine import kernels

    on = engines["graph"]
    assert kernels.pdl(on.runner.state.seed)  # an H100: PDL is on by default
    monkeypatch.setenv("TTS_PDL", "0")
    off = Engine.from_preset(PRESET, seed=0, device="cuda", settings=EngineSettings(
        max_sessions=8, max_batch=8, max_seq_len=512, decoder_precision="fp32"))
    off.start()
    try:
        for text in TEXTS[:2]:
            a, b = run(on, [text], greedy=False, codes=True)[0], run(off, [text], False, True)[0]
            assert a.shape == b.shape and (a == b).all()
    finally:
        off.shutdown()


def test_a_slot_reused_while_its_last_step_decodes_starts_clean(engines) -> None:
    """A session closed mid-utterance hands its slot to the next one at once, while its
    last step may still run on the decoder's stream: the newcomer's prompt must reset the
    decoder state after that step, so its audio equals its audio on an idle engine."""
    import time

    from voice_tts.engine import AudioPacket, SessionParams

    e = engines["graph"]
    ref = run(e, TEXTS[1:2], greedy=True)[0]
    for delay in (0.0, 0.003, 0.02):
        started = threading.Event()
        a = e.open_session(SessionParams(voice="vivian", seed=3, max_frames=300),
                           lambda ev, s=started: isinstance(ev, AudioPacket) and s.set())
        a.push_text(TEXTS[0])
        a.flush()
        assert started.wait(60)
        time.sleep(delay)
        a.close()
        assert e.scheduler.free_slots[-1] == a.slot  # the next session gets this slot
        out = run(e, TEXTS[1:2], greedy=True)[0]
        assert len(out) == len(ref)
        assert snr_db(ref, out) >= 60, f"delay {delay}: SNR {snr_db(ref, out):.1f} dB"


def test_batched_equals_solo() -> None:
    """float32, so that a batch's different GEMM shapes cannot flip a greedy argmax."""
    e = Engine.from_preset(PRESET, seed=0, device="cuda", dtype=torch.float32,
                           settings=EngineSettings(max_sessions=4, max_batch=4,
                                                   max_seq_len=512, decoder_precision="fp32"))
    e.start()
    try:
        together = run(e, TEXTS, greedy=True)
        for i, t in enumerate(TEXTS):
            solo = run(e, [t], greedy=True)[0] if i == 0 else run(e, ["x"] * i + [t],
                                                                  greedy=True)[i]
            assert len(solo) == len(together[i])
            assert snr_db(solo, together[i]) >= 60, f"session {i}"
    finally:
        e.shutdown()


def test_a_call_beside_a_running_one_steps_apart_and_equals_solo(monkeypatch) -> None:
    """A session that arrives while another speaks takes its first step in a launch of
    its own (`first_step_apart_max_rows`), between the running batch's graphed steps:
    both sessions' audio equals their solo runs (float32, greedy)."""
    from voice_tts.engine import AudioPacket, SessionParams, UtteranceEnd

    e = Engine.from_preset(PRESET, seed=0, device="cuda", dtype=torch.float32,
                           settings=EngineSettings(max_sessions=4, max_batch=4,
                                                   max_seq_len=512, decoder_precision="fp32"))
    apart: list[int] = []
    first_steps = e._first_steps
    monkeypatch.setattr(e, "_first_steps", lambda rows: (apart.append(len(rows)),
                                                         first_steps(rows))[1])
    e.start()
    try:
        solo = [run(e, [t], greedy=True)[0] for t in TEXTS[:2]]
        assert apart == []  # alone, nothing runs beside a first step
        outs: list[list[np.ndarray]] = [[], []]
        done = [threading.Event(), threading.Event()]

        def sink(i):
            def f(item):
                if isinstance(item, AudioPacket):
                    outs[i].append(item.pcm)
                elif isinstance(item, UtteranceEnd):
                    done[i].set()
            return f

        sessions = []
        for i in range(2):
            s = e.open_session(SessionParams(voice="vivian", seed=7, max_frames=40,
                                             sampling=SamplingParams.greedy()), sink(i))
            sessions.append(s)
            s.push_text(TEXTS[i])
            s.flush()
            while not outs[0]:  # the second arrives once the first speaks
                time.sleep(0.001)
        for d in done:
            assert d.wait(120)
        for s in sessions:
            s.close()
        assert apart == [1]
        for i, (one, both) in enumerate(zip(solo, outs, strict=True)):
            both = np.concatenate(both)
            assert len(one) == len(both)
            assert snr_db(one, both) >= 60, f"session {i}: SNR {snr_db(one, both):.1f} dB"
    finally:
        e.shutdown()


def test_no_gpu_memory_growth_over_1000_sessions(engines) -> None:
    e = engines["graph"]
    run(e, TEXTS[:1], greedy=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for _ in range(250):
        run(e, ["Hi."] * 4, greedy=True)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base < 64 * 2**20


def test_clone_voices_graphs_equal_eager() -> None:
    """Library voices on the graphed engine give the eager engine's audio: an in-context
    clone with a 150-frame reference (a ~170-row prompt: the 256-row prefill bucket, its
    extra-vector buffer; the speech decoder primed on its own stream) and an x-vector
    clone, batched together."""
    from voice_tts.engine.voices import VoicePrompt

    rng = np.random.default_rng(0)
    voices = {"icl": VoicePrompt(x_vector=rng.standard_normal(1024).astype(np.float32),
                                 ref_codes=rng.integers(0, 2048, (150, 16)),
                                 ref_text="The reference recording says this."),
              "xvec": VoicePrompt(x_vector=rng.standard_normal(1024).astype(np.float32))}
    outs = {}
    for graphs in (False, True):
        e = Engine.from_preset("0.6b-base", seed=0, device="cuda", settings=EngineSettings(
            max_sessions=4, max_batch=4, max_seq_len=512, cuda_graphs=graphs,
            decoder_precision="fp32"))
        for name, prompt in voices.items():
            e.add_voice(name, prompt)
        e.start()
        try:
            outs[graphs] = run(e, TEXTS[:2], greedy=True, voices=list(voices))
            if graphs:
                assert e.runner.prefill_graphs.replays > 0
        finally:
            e.shutdown()
    for a, b in zip(outs[False], outs[True], strict=True):
        assert len(a) == len(b)
        assert snr_db(a, b) >= 60, f"SNR {snr_db(a, b):.1f} dB"
