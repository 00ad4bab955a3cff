"""Which engine failures the process can survive.

A CUDA error (an illegal memory access, a device-side assert, a launch failure) is
sticky: every later call on that CUDA context fails too, so a server that goes on after
one says SERVING and serves nothing. Such a fault is fatal: the engine stops, and the
server turns NOT_SERVING, ends its calls with UNAVAILABLE and exits for the
orchestrator to restart it. Anything else (one session's bad input, a bug in one
step's bookkeeping) ends only the utterances that step touched.
"""

from __future__ import annotations

import time

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


# What an injected fault raises: a CUDA error exactly as torch words it (fatal), or a
# plain bug (ends only the utterances of the step it hits).
_INJECTED = {"cuda": "CUDA error: an illegal memory access was encountered",
             "bug": "injected bookkeeping bug"}
_STAGES = ("launch", "tokens")


class FaultInjection:
    """A test hook (`EngineSettings.fault`, the server's TTS_TEST_FAULT): the n-th decode
    step fails. Spec `<kind>@<n>[:<stage>]`: kind `cuda` (a RuntimeError with a CUDA
    error's text: fatal), `bug` (a ValueError: ends that step's utterances), `hang`
    (never returns: for the stall watchdog) or `eos` (no failure: every row of that step
    samples codec EOS, the model ending its utterances there, whether or not their text
    is flushed; random weights at the tiny shapes never sample it); stage `launch`
    (default: the launch raises) or `tokens` (reading the step's tokens raises, as a
    fault surfacing at the sync)."""

    def __init__(self, spec: str) -> None:
        kind_at, _, stage = spec.partition(":")
        kind, _, at = kind_at.partition("@")
        stage = stage or "launch"
        if kind not in (*_INJECTED, "hang", "eos") or not at.isdigit() or int(at) < 1 or \
                stage not in _STAGES:
            raise ValueError(
                f"fault spec {spec!r}: use <cuda|bug|hang|eos>@<n>[:launch|tokens]")
        self.kind, self.at, self.stage = kind, int(at), stage
        self.launches = 0

    def on_launch(self) -> None:
        """Counts a step launch; raises at the n-th when the stage is `launch`."""
        self.launches += 1
        if self.stage == "launch":
            self._hit()

    def on_tokens(self) -> None:
        """Before the tokens of the last launched step are read."""
        if self.stage == "tokens":
            self._hit()

    def tokens(self, tokens: list[int], eos: int) -> list[int]:
        """The last launched step's codebook-0 tokens as the scheduler reads them."""
        if self.kind == "eos" and self.launches == self.at:
            return [eos] * len(tokens)
        return tokens

    def _hit(self) -> None:
        if self.launches != self.at or self.kind == "eos":
            return
        if self.kind == "hang":
            time.sleep(3600)
        error = RuntimeError if self.kind == "cuda" else ValueError
        raise error(_INJECTED[self.kind])
