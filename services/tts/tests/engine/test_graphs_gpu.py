"""GPU only (skipped without CUDA; run on the device with `pytest -m gpu`): the Triton
decode attention equals SDPA, the CUDA-graph decode step equals eager, batched equals
solo, and 1,000 sessions leak no GPU memory."""

from __future__ import annotations

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
            max_sessions=8, max_batch=8, max_seq_len=512, cuda_graphs=graphs))
        e.start()
        out["graph" if graphs else "eager"] = e
    yield out
    for e in out.values():
        e.shutdown()


def run(engine: Engine, texts: list[str], greedy: bool) -> list[np.ndarray]:
    import threading

    from voice_tts.engine import AudioPacket, SessionParams, UtteranceEnd

    outs: list[list[np.ndarray]] = [[] for _ in texts]
    done = [threading.Event() for _ in texts]

    def sink(i):
        def f(item):
            if isinstance(item, AudioPacket):
                outs[i].append(item.pcm)
            elif isinstance(item, UtteranceEnd):
                done[i].set()
        return f

    sampling = SamplingParams.greedy() if greedy else SamplingParams()
    sessions = [engine.open_session(SessionParams(voice="vivian", seed=7 + i, sampling=sampling,
                                                  max_frames=40), sink(i))
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
def test_decode_attention_equals_sdpa(dtype) -> None:
    from voice_tts.engine.model.decode_attention import decode_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    s, kvh, h, length, d, b = 9, 8, 16, 300, 128, 5
    kc = torch.randn(s, kvh, length, d, device="cuda", generator=g).to(dtype)
    vc = torch.randn(s, kvh, length, d, device="cuda", generator=g).to(dtype)
    q = torch.randn(b, h, 1, d, device="cuda", generator=g).to(dtype)
    slots = torch.tensor([3, 0, 8, 3, 5], device="cuda")
    lengths = torch.tensor([1, 17, 64, 300, 129], device="cuda")
    out = decode_attention(q, kc, vc, slots, lengths, d ** -0.5).view(b, h, d).double()
    for i in range(b):
        n, sl = int(lengths[i]), int(slots[i])
        k = kc[sl, :, :n].double().repeat_interleave(h // kvh, 0)
        v = vc[sl, :, :n].double().repeat_interleave(h // kvh, 0)
        ref = torch.softmax(q[i, :, 0].double()[:, None] @ k.transpose(1, 2) * d ** -0.5,
                            -1) @ v  # (H, 1, D)
        err = (out[i] - ref[:, 0]).norm() / ref.norm()
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"row {i}: {err:.2e}"


def test_graphs_equal_eager(engines) -> None:
    eager = run(engines["eager"], TEXTS, greedy=True)
    graph = run(engines["graph"], TEXTS, greedy=True)
    for a, b in zip(eager, graph, strict=True):
        assert len(a) == len(b)
        assert snr_db(a, b) >= 60, f"SNR {snr_db(a, b):.1f} dB"


def test_batched_equals_solo() -> None:
    """float32, so that a batch's different GEMM shapes cannot flip a greedy argmax."""
    e = Engine.from_preset(PRESET, seed=0, device="cuda", dtype=torch.float32,
                           settings=EngineSettings(max_sessions=4, max_batch=4,
                                                   max_seq_len=512))
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


def test_no_gpu_memory_growth_over_1000_sessions(engines) -> None:
    e = engines["graph"]
    run(e, TEXTS[:1], greedy=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for _ in range(250):
        run(e, ["Hi."] * 4, greedy=True)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base < 64 * 2**20
