"""ONNX Runtime sessions as the agent runs them: a fixed number of intra-op threads, one
inter-op thread, sequential execution, and idle threads that sleep (no spinning), so a
model a process shares across its conversations costs no CPU between runs and never
takes more cores than it was given (moonshine.py, smart_turn.py)."""

from __future__ import annotations

from typing import Any


def session_options(threads: int) -> Any:
    """`onnxruntime.SessionOptions` for a bounded, quiet session of `threads` threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts
