"""Smart Turn v3.2 on our own ONNX Runtime session: the audio end-of-turn model.

Smart Turn v3.2 (Daily, BSD-2, 8M parameters) reads the last <= 8 s of a turn's 16 kHz
audio and says how likely the speaker is done. Its CPU file ships inside the `pipecat-ai`
wheel (`pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx`); we take only that
file (`fetch`, run by `make venvs` / `make venvs-mesh` and the agent's image), never
pipecat itself, and run it here with bounded threads.

The preprocessing is pipecat's (`local_smart_turn_v3.py`, `_whisper_features.py` at
PIPECAT_VERSION), itself `transformers.WhisperFeatureExtractor(chunk_length=8)` with
`padding="max_length", max_length=128000, truncation=True, do_normalize=True` on its numpy
path: the audio's last 8 s, zero-padded at the START; zero-mean unit-variance over the
whole 8 s (padding included); a centred, reflect-padded 400-point periodic-Hann STFT every
160 samples in float64; power through 80 Slaney mel filters; log10 floored at 1e-10; the
last frame dropped; clamped to max - 8; (x + 4) / 4. Input (batch, 80, 800) float32
`input_features`; output `logits` (batch, 1), already a sigmoid probability.

Batching: `predict` from any number of conversations (any event loop or thread) queues
its audio for ONE worker thread; while that thread runs a batch, new requests wait, and
then all of them (up to `MAX_BATCH`) go in the next one, so 64 conversations in a process
cost one thread of `threads` intra-op threads, never 64 executors' worth. On a CPU a
decision costs ~55 ms of one core, batched or not: one process answers ~18 a second.

The file's place (`default_path`): `<sys.prefix>/share/voice-agent/`, i.e. inside the
venv that runs the agent: `.venv/agent/share/voice-agent/` for the editable install,
`/opt/venv/share/voice-agent/` in the image. This module knows nothing of VAD, turns or
settings: the caller decides when to ask and what a probability means.

  python -m voice_agent.smart_turn fetch [--dest PATH] [--source FILE]
  python -m voice_agent.smart_turn predict speech.wav
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import hashlib
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import wave
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

AUDIO_RATE = 16000
MAX_SECONDS = 8
N_SAMPLES = AUDIO_RATE * MAX_SECONDS  # 128000
N_FFT, HOP, N_MELS = 400, 160, 80
N_FRAMES = N_SAMPLES // HOP  # 800: 801 STFT frames less the dropped last one
# The newest pipecat-ai release with this file (2026-10-24); the sha256 is the file's.
PIPECAT_VERSION = "1.14.0"
MODEL_NAME = "smart-turn-v3.2-cpu.onnx"
WHEEL_MEMBER = f"pipecat/audio/turn/smart_turn/data/{MODEL_NAME}"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
FIX = ("run `make venvs` (the agent venv fetches it) or "
       "`python -m voice_agent.smart_turn fetch`, or set AGENT_SMART_TURN_MODEL to a copy")


class ModelMissing(FileNotFoundError):
    """The ONNX file is not where it was looked for; the message says how to get it."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"Smart Turn v3.2 model not found at {path}: {FIX}")
        self.path = path


def default_path() -> Path:
    """Where `fetch` puts the file: the running venv's share/voice-agent/."""
    return Path(sys.prefix) / "share" / "voice-agent" / MODEL_NAME


# --- features ----------------------------------------------------------------------------

def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = 3.0 * f / 200.0
    log = f >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(f, 1000.0) / 1000.0) * (27.0 / np.log(6.4)),
                    mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    hz = 200.0 * m / 3.0
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), hz)


@functools.cache
def mel_filters() -> np.ndarray:
    """(80, 201) Slaney-normalised triangles from 0 to 8 kHz (transformers' mel_filter_bank
    with norm="slaney", mel_scale="slaney"), float64, computed once."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.float64(0.0)),
                                   _hz_to_mel(np.float64(AUDIO_RATE / 2)), N_MELS + 2))
    fft_hz = np.linspace(0, AUDIO_RATE // 2, N_FFT // 2 + 1)
    slopes = edges[None, :] - fft_hz[:, None]  # (201, 82)
    down = -slopes[:, :-2] / np.diff(edges)[:-1]
    up = slopes[:, 2:] / np.diff(edges)[1:]
    bank = np.maximum(0.0, np.minimum(down, up)) * (2.0 / (edges[2:] - edges[:-2]))
    return np.ascontiguousarray(bank.T)


@functools.cache
def _window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window


def last_8s(audio: np.ndarray) -> np.ndarray:
    """The model's 8 s window as pipecat cuts it: the last 128000 samples, zeros in front
    of a shorter clip. A new float32 array (the caller's buffer may change); int16 is
    scaled to [-1, 1)."""
    x = np.asarray(audio).reshape(-1)[-N_SAMPLES:]
    x = x / np.float32(32768) if x.dtype == np.int16 else x
    out = np.zeros(N_SAMPLES, np.float32)
    out[N_SAMPLES - len(x):] = x
    return out


def log_mel(window: np.ndarray) -> np.ndarray:
    """One (128000,) float32 window (`last_8s`) -> (80, 800) float32 log-mel features."""
    x = np.asarray(window, np.float32)
    # normalised in float32 over the padded 8 s, as transformers' zero_mean_unit_var_norm
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    x = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]  # (801, 400)
    power = np.abs(np.fft.rfft(frames * _window(), axis=-1)) ** 2  # (801, 201)
    log_spec = np.log10(np.maximum(1e-10, mel_filters() @ power.T))[:, :-1]  # (80, 800)
    return ((np.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0).astype(np.float32)


def features_batch(windows: np.ndarray) -> np.ndarray:
    """(B, 128000) windows -> (B, 80, 800); one window at a time (a batch of 64 at once
    would hold ~300 MB of float64 frames)."""
    return np.stack([log_mel(w) for w in windows])


def features(audio: np.ndarray) -> np.ndarray:
    """16 kHz mono float audio in [-1, 1], any length -> (80, 800) float32: the model's
    input for its last 8 s, as pipecat's reference preprocessing computes it."""
    return log_mel(last_8s(audio))


ZEROS = 16  # zero crossings of the resampling sinc on each side of a tap set
KAISER_BETA = 8.6  # about -80 dB of stopband


@functools.cache
def _resampler(rate: int) -> tuple[int, int, np.ndarray]:
    """rate -> 16 kHz as (up, down, taps): output n sits at input (n * down) / up, and the
    taps of its phase (n * down) % up are a Kaiser-windowed sinc cut at 0.95 of the lower
    Nyquist, centred on it (no delay), each phase summing to 1."""
    g = math.gcd(rate, AUDIO_RATE)
    up, down = AUDIO_RATE // g, rate // g
    cutoff = 0.95 * min(1.0, up / down)  # of the input's Nyquist
    half = math.ceil(ZEROS / cutoff)
    t = np.arange(-half + 1, half + 1)[None, :] - (np.arange(up) / up)[:, None]  # (up, 2h)
    taps = cutoff * np.sinc(cutoff * t)
    taps *= np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (t / half) ** 2, 0, None)))
    return up, down, taps / taps.sum(axis=1, keepdims=True)


def to_16k(pcm: np.ndarray, rate: int, seconds: float | None = MAX_SECONDS) -> np.ndarray:
    """int16 (or float in [-1, 1]) mono audio at `rate` -> float32 at 16 kHz.

    Only the last `seconds` (at `rate`, as pipecat cuts a segment before resampling; None:
    all of it) are resampled: polyphase windowed sinc, deterministic, in float (LiveKit's
    AudioResampler, soxr as pipecat's, dithers its int16 output: the same clip twice gives
    probabilities a few % apart on digital silence)."""
    x = np.asarray(pcm).reshape(-1)
    if seconds is not None:
        x = x[len(x) - min(len(x), round(seconds * rate)):]
    x = x / np.float32(32768) if x.dtype == np.int16 else x.astype(np.float64)
    if rate == AUDIO_RATE or not len(x):
        return x.astype(np.float32)
    up, down, taps = _resampler(rate)
    width = taps.shape[1]
    n_out = -(-len(x) * up // down)
    padded = np.pad(x.astype(np.float64), (width // 2, width // 2 + down))
    out = np.zeros(n_out)
    for r in range(min(up, n_out)):  # outputs r, r + up, ...: one phase, start + j * down
        count = len(range(r, n_out, up))
        start, phase = divmod(r * down, up)
        acc = np.zeros(count)
        for k in range(width):  # a strided slice a tap: no gather
            i = start + k + 1
            acc += taps[phase, k] * padded[i:i + (count - 1) * down + 1:down]
        out[r::up] = acc
    return out.astype(np.float32)


# --- the model ---------------------------------------------------------------------------

@dataclass
class Stats:
    """What the model has done in this process: for metrics."""

    batches: int = 0
    items: int = 0
    seconds: float = 0.0  # features + inference, summed over batches


# A batch costs its clips one by one on a CPU (bench/smart_turn_cost.py, 2-core EPYC, one
# thread: 53 ms a clip alone, 56 in 8, 61 in 64) and answers none before its last: 8 at
# a time, a burst of 64 has its first answers in ~0.45 s, not all at ~3.9 s.
MAX_BATCH = 8


class SmartTurn:
    """Smart Turn v3.2 on one ONNX Runtime session and one batching worker thread."""

    def __init__(self, path: str | Path, threads: int = 1, max_batch: int = MAX_BATCH) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise ModelMissing(path)
        from .onnx import session_options  # here: `fetch` runs as a lone script too

        opts = session_options(threads)  # idle threads sleep: no CPU between batches
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as pipecat
        opts.log_severity_level = 3
        self.path = path
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._input = self.session.get_inputs()[0].name
        # the batch axis is symbolic ('s6') in v3.2; a fixed one means one clip a run
        self._batched = not isinstance(self.session.get_inputs()[0].shape[0], int)
        self.max_batch = max_batch
        self._stats = Stats()
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[np.ndarray, concurrent.futures.Future] | None] = (
            queue.SimpleQueue())
        self._worker: threading.Thread | None = None

    def stats(self) -> Stats:
        with self._lock:
            return replace(self._stats)

    def _run(self, windows: np.ndarray) -> np.ndarray:
        """(B, 128000) windows -> (B,) float32 probabilities, counted in the stats."""
        t0 = time.perf_counter()
        feats = features_batch(windows)
        if self._batched:
            probs = self.session.run(None, {self._input: feats})[0].reshape(-1)
        else:
            probs = np.concatenate([self.session.run(None, {self._input: f[None]})[0].reshape(-1)
                                    for f in feats])
        with self._lock:
            self._stats.batches += 1
            self._stats.items += len(windows)
            self._stats.seconds += time.perf_counter() - t0
        return probs.astype(np.float32)

    def predict_batch(self, audios: Sequence[np.ndarray]) -> np.ndarray:
        """16 kHz clips -> (N,) probabilities that each speaker's turn is complete, in one
        run on the calling thread."""
        if not audios:
            return np.zeros(0, np.float32)
        return self._run(np.stack([last_8s(a) for a in audios]))

    async def predict(self, audio: np.ndarray) -> float:
        """One clip's probability, batched with every other request of this process."""
        future: concurrent.futures.Future[float] = concurrent.futures.Future()
        self._queue.put((last_8s(audio), future))
        self._start()
        return await asyncio.wrap_future(future)

    def _start(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="smart-turn",
                                                daemon=True)
                self._worker.start()

    def _serve(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()  # waits for the first request
            batch = []
            while item is not None:
                window, future = item
                if future.set_running_or_notify_cancel():  # its caller may have gone
                    batch.append((window, future))
                if len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()  # everything queued meanwhile
                except queue.Empty:
                    break
            stop = item is None
            if not batch:
                continue
            try:
                probs = self._run(np.stack([w for w, _ in batch]))
            except Exception as e:  # every caller of the batch hears of it
                for _, future in batch:
                    future.set_exception(e)
                continue
            for (_, future), p in zip(batch, probs, strict=True):
                future.set_result(float(p))

    def close(self) -> None:
        """Ends the worker after what is queued (a later `predict` starts a new one)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._queue.put(None)
            worker.join()


@functools.cache
def _load(path: Path, threads: int) -> SmartTurn:
    return SmartTurn(path, threads)


def load(path: str = "", threads: int = 1) -> SmartTurn:
    """The process's Smart Turn for this file ("" = `default_path()`), made once."""
    return _load((Path(path) if path else default_path()).resolve(), threads)


# --- fetch -------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _install(data: bytes, dest: Path, origin: str) -> None:
    """Writes the verified file to dest atomically (a half-written file is never there)."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODEL_SHA256:
        raise RuntimeError(f"{origin}: sha256 {digest}, expected {MODEL_SHA256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as f:
        f.write(data)
    os.chmod(f.name, 0o644)
    os.replace(f.name, dest)


def fetch(dest: Path | None = None, source: Path | None = None) -> Path:
    """Puts the pinned model file at dest (default: `default_path()`): nothing to do when a
    file with the pinned sha256 is there; else from `source` (a copy of the file, e.g. a
    Docker build input) when it exists; else from pipecat-ai==PIPECAT_VERSION's wheel, which
    pip downloads (the host's index, find-links and CA apply) and which is then deleted."""
    dest = dest or default_path()
    if dest.is_file() and _sha256(dest) == MODEL_SHA256:
        return dest
    if source is not None and source.is_file():
        _install(source.read_bytes(), dest, str(source))
        return dest
    print(f"smart_turn: {MODEL_NAME} from pipecat-ai=={PIPECAT_VERSION}'s wheel -> {dest}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, f"pipecat-ai=={PIPECAT_VERSION}"],
                       check=True)
        wheel = next(Path(tmp).glob("pipecat_ai-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            _install(z.read(WHEEL_MEMBER), dest, f"{wheel.name}:{WHEEL_MEMBER}")
    return dest


# --- command line ------------------------------------------------------------------------

def read_wav(path: str) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV -> (mono int16 samples, rate); channels are averaged."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise SystemExit(f"{path}: {8 * w.getsampwidth()}-bit samples; 16-bit PCM only")
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1).astype(np.int16)
        return pcm, w.getframerate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voice_agent.smart_turn",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help=f"put {MODEL_NAME} (pipecat-ai=={PIPECAT_VERSION}) in "
                       "place; nothing to do when it is there")
    f.add_argument("--dest", type=Path, default=None,
                   help=f"where to put it (default: {default_path()})")
    f.add_argument("--source", type=Path, default=None,
                   help="a copy of the file to take when it exists, instead of downloading")
    p = sub.add_parser("predict", help="print the probability that a WAV's turn is complete")
    p.add_argument("wav", help="16-bit PCM WAV, any rate (its last 8 s are heard)")
    p.add_argument("--model", default="", help="the ONNX file (default: fetch's place)")
    p.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch(args.dest, args.source))
        return 0
    try:
        model = load(args.model, args.threads)
    except ModelMissing as e:
        raise SystemExit(str(e)) from None
    pcm, rate = read_wav(args.wav)
    print(f"{float(model.predict_batch([to_16k(pcm, rate)])[0]):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
