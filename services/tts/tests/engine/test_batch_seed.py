"""What the contract promises for a seed (tts.proto, SessionConfig.seed; issue 51 item 9):
the same seed and text give the same codec tokens alone or batched with other streams,
and PCM within 1 LSB (s16, as the server frames it) of the stream run alone: the speech
decoder's float sums depend on the batch, so a batched stream's samples may round the
other way (seen on a GPU: 48 of 23,040 samples off by 1 LSB)."""

from __future__ import annotations

import numpy as np
import pytest
from voice_tts.engine import Engine, EngineSettings, SessionParams, to_s16

TEXT = "Hello there, this is a test of batching."


def s16(pcm: np.ndarray) -> np.ndarray:
    """As the server frames it (server/call/framing.py)."""
    return to_s16(pcm).astype(np.int64)


def speak(engine: Engine, seeds: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """One session per seed, all pushed before the first step: one batch."""
    outs = [{"pcm": [], "codes": [], "pcm16": [], "done": False} for _ in seeds]
    sessions = []
    for seed, out in zip(seeds, outs, strict=True):
        def sink(ev, out=out) -> None:
            if hasattr(ev, "pcm"):
                out["pcm"].append(np.asarray(ev.pcm))
                out["codes"].append(np.asarray(ev.codes))
                out["pcm16"].append(ev.pcm16)
            elif hasattr(ev, "reason"):
                out["done"] = True
        s = engine.open_session(SessionParams(voice="vivian", language="auto", seed=seed,
                                              max_frames=24), sink=sink)
        s.push_text(TEXT)
        s.flush()
        sessions.append(s)
    for _ in range(10_000):
        if all(o["done"] for o in outs):
            break
        engine.run_once()
    for s in sessions:
        s.close()
    assert all(o["done"] for o in outs)
    for o in outs:  # the s16 the server frames, made once a step for the batch
        assert [to_s16(p).tobytes() for p in o["pcm"]] == o["pcm16"]
    return [(np.concatenate(o["pcm"]), np.concatenate(o["codes"])) for o in outs]


@pytest.fixture(scope="module")
def engine() -> Engine:
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
    yield e
    e.shutdown()


def test_same_seed_batched_is_the_same_tokens_and_pcm_within_one_lsb(engine) -> None:
    seed = 3
    [(alone, alone_codes)] = speak(engine, [seed])
    batched = speak(engine, [seed, seed, seed + 100])
    for pcm, codes in batched[:2]:
        np.testing.assert_array_equal(codes, alone_codes)  # the same tokens, always
        assert len(pcm) == len(alone)
        assert int(np.abs(s16(pcm) - s16(alone)).max()) <= 1
    # and alone again is bit-equal: the same batch, the same audio
    [(again, again_codes)] = speak(engine, [seed])
    np.testing.assert_array_equal(again_codes, alone_codes)
    np.testing.assert_array_equal(again, alone)
