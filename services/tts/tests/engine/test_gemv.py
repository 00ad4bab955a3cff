"""The decode-step GEMV (engine/kernels/gemv.py) against F.linear, in float32 on CPU through
Triton's interpreter (tests/conftest.py turns it on without CUDA; on a GPU the same tests
run the compiled kernel). bf16 against cuBLAS is bench/tune_gemv.py's check, on the GPU.
Small odd shapes keep the interpreter fast and hit every masked tail."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from voice_tts.engine import kernels

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="needs triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=1e-5, atol=1e-5)  # float32 sums in another order


@pytest.fixture(autouse=True)
def fused_path():
    with kernels.interpret_on_cpu() if DEVICE == "cpu" else contextlib.nullcontext():
        yield


def randn(*shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k", "config"), [
    (37, 300, (8, 64, 2, 2)),   # N and K both past a whole block: masked tails, 5 K chunks
    (24, 256, (4, 128, 2, 3)),  # whole blocks: the unmasked (EVEN_K) loads
    (5, 70, None),              # the heuristic config, one partial chunk
])
def test_linear_equals_f_linear(m: int, n: int, k: int, config) -> None:
    from voice_tts.engine.kernels import gemv

    x, w = randn(m, k, seed=m), randn(n, k, seed=10 + m)
    y = gemv.linear(x, w, config=config)
    assert y.shape == (m, n) and y.dtype == x.dtype
    torch.testing.assert_close(y, F.linear(x, w), **TOL)


def test_linear_takes_any_leading_dims_and_strided_views() -> None:
    w = randn(19, 96, seed=1)
    big = randn(3, 4, 128, seed=2)
    views = {
        "1-D": big[0, 0, :96],
        "3-D": big[:2, :2, :96],           # rows at two strides, (2, 2) -> 4 rows
        "3-D transposed": big[:2, :2, :96].transpose(0, 1),
        "2-D rows apart": big[:, 1, 16:112],
        "4-D": big[:1, :2, :96].unsqueeze(0),
        "last dim strided (copied)": randn(3, 192, seed=3)[:, ::2],
    }
    for name, x in views.items():
        torch.testing.assert_close(kernels.linear(x, w, config=(4, 64, 2, 2)), F.linear(x, w),
                                   **TOL, msg=name)


@pytest.mark.parametrize("m", [1, 3])
def test_silu_mul_linear_equals_silu_mul_then_f_linear(m: int) -> None:
    from voice_tts.engine.kernels import layer_ops

    x, w = randn(m, 2 * 80, seed=3), randn(21, 80, seed=4)  # K = 80: a masked K tail
    ref = F.linear(layer_ops.silu_mul(x), w)
    torch.testing.assert_close(kernels.linear(x, w, "silu_mul", config=(8, 32, 2, 2)), ref,
                               **TOL)
    x3 = randn(1, m, 2 * 80, seed=5)  # (B, T, 2I) as the MLP sees it
    torch.testing.assert_close(kernels.linear(x3, w, "silu_mul"),
                               F.linear(layer_ops.silu_mul(x3), w), **TOL)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("add", [False, True])
def test_norm_linear_equals_rms_norm_then_linear(m: int, add: bool) -> None:
    """The RMSNorm taken inside the GEMV (of x, or of x + residual, which it also returns
    as the new residual stream) equals the norm kernel followed by F.linear."""
    from voice_tts.engine.kernels import gemv, layer_ops

    x, w, nw = randn(m, 300, seed=20 + m), randn(37, 300, seed=21), randn(300, seed=22)
    r = randn(m, 300, seed=23) if add else None
    y, h = gemv.norm_linear(x, r, nw, 1e-6, w, config=(8, 64, 2, 2))
    normed, h_ref = layer_ops.rms_norm(x, nw, 1e-6, r)
    torch.testing.assert_close(y, F.linear(normed, w), **TOL)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    assert (h.data_ptr() == x.data_ptr()) != add  # no residual: x is the stream, not copied


def test_norm_linear_takes_prefill_rows_strided_views_and_falls_back() -> None:
    from voice_tts.engine.kernels import gemv, layer_ops

    w, nw = randn(29, 96, seed=24), randn(96, seed=25)
    big = randn(2, 3, 128, seed=26)
    cases = {
        "(B, T, K) rows": (big[:1, :2, :96].contiguous(), randn(1, 2, 96, seed=27)),
        "rows apart": (big[:, 1, 16:112], randn(2, 96, seed=28)),
        "6 rows: the norm kernel + F.linear": (big[:, :, :96], randn(2, 3, 96, seed=29)),
    }
    for name, (x, r) in cases.items():
        y, h = gemv.norm_linear(x, r, nw, 1e-5, w)
        normed, h_ref = layer_ops.rms_norm(x, nw, 1e-5, r)
        torch.testing.assert_close(y, F.linear(normed, w), **TOL, msg=name)
        torch.testing.assert_close(h, h_ref, rtol=0, atol=0, msg=name)
        assert y.shape == (*x.shape[:-1], 29) and h.shape == x.shape, name


def test_more_rows_fall_back_to_f_linear() -> None:
    from voice_tts.engine.kernels import gemv, layer_ops

    x, w = randn(2, 3, 48, seed=6), randn(10, 48, seed=7)  # 6 rows > MAX_ROWS
    assert x.numel() // 48 > gemv.MAX_ROWS
    torch.testing.assert_close(kernels.linear(x, w), F.linear(x, w), rtol=0, atol=0)
    gu = randn(6, 96, seed=8)
    torch.testing.assert_close(kernels.linear(gu, w, "silu_mul"),
                               F.linear(layer_ops.silu_mul(gu), w), rtol=0, atol=0)


def test_configs_none_means_cublas(monkeypatch) -> None:
    """A tuned entry of None (cuBLAS was as fast) and an empty x run F.linear, not the
    kernel."""
    from voice_tts.engine.kernels import gemv

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("the kernel was launched")

    x, w = randn(2, 40, seed=11), randn(9, 40, seed=12)
    monkeypatch.setitem(gemv.CONFIGS, (9, 40, 2, None), None)
    monkeypatch.setattr(gemv, "_gemv", NoLaunch())
    torch.testing.assert_close(gemv.linear(x, w), F.linear(x, w), rtol=0, atol=0)
    assert gemv.linear(x[:0], w).shape == (0, 9)


def test_linear_off_the_fused_path_is_the_plain_ops(monkeypatch) -> None:
    """Where `active(x)` is false (a CPU tensor outside `interpret_on_cpu`), the plain
    PyTorch ops run: no Triton at all."""
    monkeypatch.setattr(kernels.launch, "_on_cpu", False)
    x, w = randn(2, 64, seed=9).cpu(), randn(12, 32, seed=10).cpu()
    assert not kernels.active(x)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.linear(x, w, "silu_mul"),
                               F.linear(F.silu(gate) * up, w), rtol=0, atol=0)
    torch.testing.assert_close(kernels.linear(x[:, :32], w), F.linear(x[:, :32], w),
                               rtol=0, atol=0)


def test_linear_rejects_mismatched_shapes() -> None:
    w = randn(8, 32)
    with pytest.raises(ValueError, match="does not fit"):
        kernels.linear(randn(1, 33), w)
    with pytest.raises(ValueError, match="does not fit"):
        kernels.linear(randn(1, 32), w, "silu_mul")  # gate|up is 2K wide
    with pytest.raises(ValueError, match="unknown act"):
        kernels.linear(randn(1, 32), w, "gelu")


COMPILE = """
import triton
from compile_kernels import compile_for_hopper
from voice_tts.engine.kernels import gemv

ptrs = {n: "*bf16" for n in ("x_ptr", "w_ptr", "y_ptr", "r_ptr", "nw_ptr", "h_ptr")}
for m in range(1, gemv.MAX_ROWS + 1):
    # heuristic configs; the projection after a norm (with the residual add at even m)
    for n, k, act in ((4096, 4096, None), (1024, 4096, "silu_mul")):
        bn, bk, nw, st = gemv._config(n, k, m, act)
        compile_for_hopper(gemv._gemv, ptrs, dict(
            M=m, ACT=act is not None, NORM=act is None, ADD=act is None and m % 2 == 0,
            KP=k, EVEN_K=True, BLOCK_N=bn, BLOCK_K=bk, STAGES=st, PDL=True))
compile_for_hopper(gemv._gemv, {n: "*fp32" for n in ptrs}, dict(
    M=3, ACT=True, NORM=False, ADD=False, KP=512, EVEN_K=False, BLOCK_N=8, BLOCK_K=128,
    STAGES=1, PDL=False))
"""


def test_gemv_compiles_for_hopper() -> None:
    """The interpreter does not type-check like the compiler: compile the kernel for sm_90
    (no GPU needed) in a process with the interpreter off (as test_kernels.py does)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 2 * 4 + 1, proc.stdout
