"""Fixtures: tiny random checkpoints in the official layout, engines, the oracle runner.

Checkpoints are written once per test session by our writer (`save_checkpoint`) with the
demo tokenizer's vocab.json/merges.txt; engines load them back through
`Engine.from_pretrained`, and the oracle loads the very same files in the official code.
The codec EOS row of the talker head is scaled up (lib.EOS_BOOST) so that greedy decoding
of random weights reaches EOS within tens of frames: both stop paths (EOS and the length
cap) are exercised.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from voice_tts.engine import Engine, EngineSettings

from .lib import CONFIGS, write_tiny_checkpoint

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP
# barriers under oversubscription make every op ~100x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {name: write_tiny_checkpoint(name, root) for name in CONFIGS}


@pytest.fixture(scope="session")
def engines(checkpoints) -> dict[str, Engine]:
    return {name: Engine.from_pretrained(path, settings=EngineSettings(max_sessions=8))
            for name, path in checkpoints.items()}


@pytest.fixture
def tiny_engine() -> Engine:
    """A fresh preset engine (random weights, demo tokenizer), not started."""
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
    yield engine
    engine.shutdown()


