"""Fixtures: the real TTS server and the real thinker, started once per test session.

See backends.py: real servers on free localhost ports, tiny random models; no LiveKit
server exists on these machines, so session tests use our own audio I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .backends import Server, build_tiny_asr, start_thinker, start_tts


@pytest.fixture(scope="session")
def tts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_tts(tmp_path_factory.mktemp("tts"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny thinker with its ASR step (a tiny random wav2vec2): it takes audio."""
    tmp = tmp_path_factory.mktemp("thinker")
    s = start_thinker(tmp, asr_dir=build_tiny_asr(tmp))
    yield s
    s.stop()
