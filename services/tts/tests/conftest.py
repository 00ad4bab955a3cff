"""Set before anything imports Triton: on a machine without CUDA, Triton's interpreter runs
the engine's CUDA kernels on CPU tensors, so engine/test_kernels.py checks them here."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
