"""Which engine failures the process can survive.

A CUDA error (an illegal memory access, a device-side assert, a launch failure) is
sticky: every later call on that CUDA context fails too, so a server that goes on after
one says SERVING and serves nothing. Such a fault is fatal: the engine stops, and the
server turns NOT_SERVING, ends its calls with UNAVAILABLE and exits for the
orchestrator to restart it. Anything else (one session's bad input, a bug in one
step's bookkeeping) ends only the utterances that step touched.
"""

from __future__ import annotations

import torch

# Text of the errors torch raises for a broken CUDA context (RuntimeError before torch
# grew `AcceleratorError`, and still for cuBLAS / cuDNN status errors).
_STICKY = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error",
           "device-side assert", "illegal memory access", "unspecified launch failure")


class EngineFailed(RuntimeError):
    """The engine stopped after a fatal fault; the process must restart."""


def poisons_device(exc: BaseException) -> bool:
    """True for a fault after which the device cannot be used by this process again."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _STICKY)
