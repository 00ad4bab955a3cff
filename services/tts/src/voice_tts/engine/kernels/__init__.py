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
That run-time state lives in `launch`; this package only re-exports.
"""

from __future__ import annotations

from .launch import AVAILABLE, active, interpret_on_cpu, pdl, pdl_args

__all__ = ["AVAILABLE", "active", "interpret_on_cpu", "pdl", "pdl_args"]

if AVAILABLE:
    from .cache_attention import attention
    from .gemv import linear, norm_linear
    from .layer_ops import qk_norm_rope_write, rms_norm, silu_mul, snake_beta
    from .sampling import TalkerMasks, sample

    __all__ += ["TalkerMasks", "attention", "linear", "norm_linear", "qk_norm_rope_write",
                "rms_norm", "sample", "silu_mul", "snake_beta"]
