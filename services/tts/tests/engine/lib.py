"""Helpers of the engine tests: tiny checkpoints, the oracle subprocess, SNR."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from voice_tts.engine.checkpoint import random_model, save_checkpoint
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.demo_tokenizer import write_demo_tokenizer

REPO = Path(__file__).resolve().parents[4]
EOS_BOOST = 2.0
CONFIGS = ("tiny", "tiny-1.7b")


def oracle_python() -> Path | None:
    """`VOICE_ORACLE_PYTHON`, else <repo>/.venv/oracle, else <repo>/.venv-oracle, else this
    interpreter where it has the official code (`qwen_tts`: the GPU host, whose one
    Python has the engine and qwen-tts-hf side by side)."""
    env = os.environ.get("VOICE_ORACLE_PYTHON")
    candidates = [Path(env)] if env else [REPO / ".venv/oracle/bin/python",
                                          REPO / ".venv-oracle/bin/python"]
    found = next((p for p in candidates if p.exists()), None)
    if found is None and not env and importlib.util.find_spec("qwen_tts") is not None:
        return Path(sys.executable)
    return found


def write_tiny_checkpoint(name: str, directory: Path, seed: int = 0) -> Path:
    cfg = ModelConfig.from_name(name)
    model = random_model(cfg, seed)
    with torch.no_grad():
        model.talker.codec_head.weight[cfg.talker.codec_eos_token_id] *= EOS_BOOST
    tok_dir = write_demo_tokenizer(directory / "_tokenizer")
    return save_checkpoint(model, directory / name, text_tokenizer_dir=tok_dir,
                           shard_bytes=2_000_000 if name == "tiny-1.7b" else None)


def run_oracle(spec: dict, workdir: Path, script: str = "oracle_run.py") -> dict[str, np.ndarray]:
    """Run `script` (next to this file) in the oracle venv on spec.json -> its out .npz."""
    python = oracle_python()
    if python is None:
        msg = "no oracle interpreter (set VOICE_ORACLE_PYTHON or make .venv/oracle)"
        if os.environ.get("VOICE_REQUIRE_ORACLE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    spec_path, out_path = workdir / "spec.json", workdir / "oracle.npz"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run([str(python), str(Path(__file__).with_name(script)),
                           str(spec_path), str(out_path)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error",
                                               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"oracle failed (exit {proc.returncode})")
    with np.load(out_path) as data:
        return {k: data[k] for k in data.files}


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64)
                                                                        ** 2)) / noise)
