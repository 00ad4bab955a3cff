"""Run-time state of the fused path: whether Triton (and its programmatic dependent
launch) is there, which devices launch with PDL, and whether the CPU interprets the kernels
(tests). The kernel modules import it; `kernels/__init__` only re-exports."""

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

