"""Smart Turn v3.2 on our own session (smart_turn.py): our numpy features against the
reference preprocessing (transformers' WhisperFeatureExtractor as pipecat configures it),
the real model file, batching of concurrent requests, the missing file's message, audio
at other rates, and the fetch's checks."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from voice_agent import smart_turn
from voice_agent.smart_turn import (
    AUDIO_RATE,
    MAX_SECONDS,
    ModelMissing,
    SmartTurn,
    features,
    last_8s,
    to_16k,
)

RNG = np.random.default_rng(7)


def speechlike(seconds: float) -> np.ndarray:
    """Noise through a crude vocal-tract ripple, in syllables at ~4 Hz."""
    n = int(seconds * AUDIO_RATE)
    t = np.arange(n) / AUDIO_RATE
    voiced = np.sign(np.sin(2 * np.pi * 120 * t)) * 0.3 + RNG.standard_normal(n) * 0.05
    envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 2
    return (np.convolve(voiced, np.hanning(24) / 12, "same") * envelope).astype(np.float32)


def spoken(text: str, tmp: Path) -> np.ndarray:
    """espeak-ng's 22.05 kHz speech, through to_16k."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng missing: run services/agent/setup.sh")
    path = tmp / "espeak.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    pcm, rate = smart_turn.read_wav(str(path))
    assert rate == 22050
    return to_16k(pcm, rate)


def reference(audio: np.ndarray) -> np.ndarray:
    """Pipecat's preprocessing before its numpy copy (local_smart_turn_v3.py, up to 0.0.x):
    its 8 s window, then WhisperFeatureExtractor(chunk_length=8) with these arguments."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(chunk_length=8)
    out = extractor(last_8s(audio), sampling_rate=16000, return_tensors="np",
                    padding="max_length", max_length=8 * 16000, truncation=True,
                    do_normalize=True)
    return out.input_features.squeeze(0).astype(np.float32)


def test_features_are_the_reference_preprocessing(tmp_path: Path) -> None:
    long = speechlike(12)
    clips = {"noise 1 s": speechlike(1), "noise 8 s": speechlike(8), "noise 12 s": long,
             "silence": np.zeros(2 * AUDIO_RATE, np.float32), "empty": np.zeros(0, np.float32),
             "espeak": spoken("Could you book me a table for two at eight?", tmp_path)}
    for name, audio in clips.items():
        ours = features(audio)
        assert ours.shape == (80, 800) and ours.dtype == np.float32, name
        assert np.abs(ours - reference(audio)).max() < 1e-4, name
    # longer than 8 s: only the last 8 s count
    assert np.array_equal(features(long), features(long[-MAX_SECONDS * AUDIO_RATE:]))


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The file `make venvs` fetched (fetched now if this venv has none)."""
    return smart_turn.fetch()


@pytest.fixture
def model(model_path: Path) -> Iterator[SmartTurn]:
    m = SmartTurn(model_path)
    yield m
    m.close()


def test_the_model_hears_an_ended_turn_from_an_unfinished_one(
        model: SmartTurn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = spoken("I would like to book a table for two tonight.", tmp_path)
    unfinished = spoken("I would like to book a table for, um, and", tmp_path)
    p_done, p_unfinished = model.predict_batch([done, unfinished])
    assert p_done > 0.5 > p_unfinished, (p_done, p_unfinished)
    # the command line, on the last WAV spoken (a path to a model: the test's own file)
    smart_turn.main(["predict", "--model", str(model.path), str(tmp_path / "espeak.wav")])
    assert float(capsys.readouterr().out) == pytest.approx(p_unfinished, abs=1e-4)


def test_a_batch_is_its_clips_one_by_one(model: SmartTurn) -> None:
    clips = [speechlike(s) for s in (0.5, 2, 5, 8, 11)] + [np.zeros(100, np.float32)]
    batch = model.predict_batch(clips)
    alone = np.array([model.predict_batch([c])[0] for c in clips])
    assert batch.shape == (len(clips),) and batch.dtype == np.float32
    assert ((batch >= 0) & (batch <= 1)).all()
    np.testing.assert_allclose(batch, alone, atol=1e-5)
    assert model.predict_batch([]).shape == (0,)
    stats = model.stats()
    assert (stats.batches, stats.items) == (1 + len(clips), 2 * len(clips))
    assert stats.seconds > 0


async def test_concurrent_requests_share_batches(model: SmartTurn) -> None:
    clips = [speechlike(1 + i % 5) for i in range(16)]
    alone = [float(model.predict_batch([c])[0]) for c in clips]
    before = model.stats()
    got = await asyncio.gather(*(model.predict(c) for c in clips))
    np.testing.assert_allclose(got, alone, atol=1e-5)
    stats = model.stats()
    assert stats.items - before.items == 16
    # the first alone at most, the rest together, MAX_BATCH (8) at a time
    assert 2 <= stats.batches - before.batches <= 3


async def test_a_cancelled_request_leaves_the_others_their_answers(model: SmartTurn) -> None:
    clips = [speechlike(2) for _ in range(4)]
    tasks = [asyncio.create_task(model.predict(c)) for c in clips]
    await asyncio.sleep(0)  # all queued
    tasks[1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert all(isinstance(p, float) and 0 <= p <= 1 for i, p in enumerate(done) if i != 1)
    assert 0 <= await model.predict(clips[0]) <= 1  # the worker goes on


THREADS = """
import asyncio, os, sys
import numpy as np
import onnxruntime  # its import starts a thread of its own, once a process
from voice_agent.smart_turn import SmartTurn

def threads():
    return len(os.listdir("/proc/self/task"))

async def main():
    before = threads()
    m = SmartTurn(sys.argv[1], threads=1)
    await asyncio.gather(*(m.predict(np.zeros(16000, np.float32)) for _ in range(8)))
    during = threads()
    m.close()
    for _ in range(100):  # joined; the OS may take a moment to reap it
        if threads() == before:
            break
        await asyncio.sleep(0.01)
    print(during - before, threads() - before)

asyncio.run(main())
"""


def test_a_process_of_conversations_costs_one_thread(model_path: Path) -> None:
    """threads=1: no ONNX Runtime pool, one worker for all who ask, gone on close (in a
    fresh process: this one has LiveKit's and others' threads coming and going)."""
    out = subprocess.run([sys.executable, "-c", THREADS, str(model_path)], check=True,
                         capture_output=True, text=True).stdout
    assert out.split() == ["1", "0"]


def test_load_is_one_model_a_file(model_path: Path) -> None:
    assert smart_turn.load(str(model_path)) is smart_turn.load(str(model_path))
    assert smart_turn.load() is smart_turn.load("")


def test_a_missing_file_says_where_it_looked_and_how_to_get_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "smart-turn-v3.2-cpu.onnx"
    with pytest.raises(ModelMissing) as e:
        smart_turn.load(str(missing))
    message = str(e.value)
    assert str(missing) in message
    assert "make venvs" in message and "python -m voice_agent.smart_turn fetch" in message
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(SystemExit, match="make venvs"):  # the command line: no traceback
        smart_turn.main(["predict", "--model", str(missing), str(tmp_path / "x.wav")])


@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_other_rates_come_to_16k(rate: int) -> None:
    t = np.arange(3 * rate) / rate
    pcm = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    audio = to_16k(pcm, rate)
    assert audio.dtype == np.float32 and len(audio) == 3 * AUDIO_RATE
    want = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(audio)) / AUDIO_RATE)
    assert np.abs(audio[200:-200] - want[200:-200]).max() < 1e-3
    # float input is the same audio, the same every time; only the last 8 s are kept, as
    # pipecat cuts them
    np.testing.assert_allclose(to_16k(pcm / 32768.0, rate), audio, atol=1e-6)
    assert np.array_equal(to_16k(pcm, rate), audio)
    assert len(to_16k(np.tile(pcm, 4), rate)) == MAX_SECONDS * AUDIO_RATE


def test_16k_passes_through() -> None:
    pcm = (RNG.standard_normal(1600) * 3000).astype(np.int16)
    np.testing.assert_array_equal(to_16k(pcm, AUDIO_RATE), pcm / np.float32(32768))
    assert len(to_16k(np.zeros(0, np.int16), 48000)) == 0


def test_fetch_checks_what_it_installs(model_path: Path, tmp_path: Path) -> None:
    dest = tmp_path / "share" / "model.onnx"
    copy = tmp_path / "copy.onnx"
    shutil.copy(model_path, copy)
    assert smart_turn.fetch(dest, source=copy) == dest
    assert dest.read_bytes() == model_path.read_bytes()
    copy.unlink()
    assert smart_turn.fetch(dest, source=copy) == dest  # there already: nothing to do
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not the model")
    with pytest.raises(RuntimeError, match="sha256"):
        smart_turn.fetch(tmp_path / "other.onnx", source=bad)
    assert not (tmp_path / "other.onnx").exists()
