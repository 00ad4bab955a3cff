"""Triton kernels of the decode path (CUDA; interpreted on CPU in the tests).

The plain-PyTorch modules issue ~55 kernels per decoder layer (RMSNorm alone is six
element-wise ops, RoPE ten, the cache write an index_put each for k and v) and ~20 per
sampled token. The code predictor runs 15 tokens x 5 layers per frame, so a graphed step
was bound by kernel count, not by math (13 of 22 ms at batch 1 on an H100). These kernels
fuse each of those groups into one launch, with the same roundings as the module they
replace (every intermediate the reference rounds to the model dtype is rounded here too):

- `rms_norm`: [residual add +] RMSNorm (`layer_ops`);
- `qk_norm_rope_write`: per-head q/k RMSNorm, RoPE, and the k/v cache write (`layer_ops`);
- `silu_mul`: the MLP's SiLU(gate) * up on the fused gate|up projection (`layer_ops`);
- `linear`: x W^T for 1-4 rows of x (the decode step's projections at small batch),
  optionally with that SiLU-mul fused in, streaming W once (`gemv`); `norm_linear` takes
  the layer's [residual add +] RMSNorm inside the GEMV;
- `snake_beta`: the speech decoder's SnakeBeta activation (`layer_ops`);
- `attention`: causal attention of each query row over its slot's cache, read in place
  (`cache_attention`);
- `sample`: repetition penalty, masks, temperature, top-k, top-p and the seeded
  exponential race of `sampling.py` in one pass over the vocabulary (`sampling`).

Programmatic dependent launch (Hopper+, `pdl(x)`): each of these kernels may be launched
while the kernel before it in the stream finishes; it waits for that kernel
(`gdc_wait`, before it reads or writes anything a kernel of the step writes) and then lets
the next one launch. A decode step is ~1,100 such small kernels in a row, so the launch
gap between them was a large part of it; the GEMV also starts streaming its weight (never
written during a step) before it waits. TTS_PDL=0 turns it off.

`active(x)` says whether the fused path runs for tensors like x: on CUDA when Triton is
installed, and on CPU only where a test asks for it (`interpret_on_cpu`), under
TRITON_INTERPRET=1, to check the kernels against the reference modules without a GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

try:
    import triton  # noqa: F401
except ImportError:  # CPU-only installs: the plain-PyTorch path is used
    AVAILABLE = GDC = False
else:
    AVAILABLE = True
    try:  # grid dependency control (programmatic dependent launch), Triton >= 3.4
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        GDC = False
    else:
        GDC = True

_on_cpu = False
_pdl_devices: dict[int, bool] = {}


def pdl(x: torch.Tensor) -> bool:
    """Whether kernels on x's device launch with programmatic dependent launch (sm90+)."""
    if not x.is_cuda or os.environ.get("TTS_PDL", "1") == "0":
        return False
    i = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if i not in _pdl_devices:
        _pdl_devices[i] = GDC and torch.cuda.get_device_capability(i)[0] >= 9
    return _pdl_devices[i]


def pdl_args(x: torch.Tensor) -> dict:
    """A launch's PDL arguments: the kernels' `PDL` flag (does it wait in-kernel) and, where
    on, Triton's `launch_pdl` (absent otherwise: older Triton does not know it)."""
    return {"PDL": True, "launch_pdl": True} if pdl(x) else {"PDL": False}


def active(x: torch.Tensor) -> bool:
    return AVAILABLE and (x.is_cuda or (_on_cpu and x.device.type == "cpu"))


@contextlib.contextmanager
def interpret_on_cpu() -> Iterator[None]:
    """Run the fused path on CPU tensors through Triton's interpreter (tests only)."""
    global _on_cpu
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before triton is imported")
    _on_cpu = True
    try:
        yield
    finally:
        _on_cpu = False


if AVAILABLE:
    from .cache_attention import attention
    from .gemv import linear, norm_linear
    from .layer_ops import qk_norm_rope_write, rms_norm, silu_mul, snake_beta
    from .sampling import TalkerMasks, sample

    __all__ = ["AVAILABLE", "TalkerMasks", "active", "attention", "interpret_on_cpu",
               "linear", "norm_linear", "pdl", "pdl_args", "qk_norm_rope_write", "rms_norm",
               "sample", "silu_mul", "snake_beta"]
