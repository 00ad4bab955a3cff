"""Cloned voices for the open-loop benchmark (bench/openloop.py `--clone-voices N`).

Reference audio made here, deterministic and speech-like: espeak-ng's English (if it is
installed; `--clone-audio espeak`) or a synthetic voice (`synth`): a glottal-like sum of
harmonics on a moving pitch, two formants that change every syllable, syllables under
an amplitude envelope with pauses between words. Each voice has its own pitch and seed.
Every reference is exactly `seconds` long (espeak's is looped or cut), with a transcript
(the sentences it says or, synthetic, that the in-context prompt carries: its length is
what matters to the engine, ~14 characters a second).

The voices are made through the server's gRPC `CreateVoice` (the time of each call is
the "time to create a voice"), probed one call at a time at idle (first use of a voice,
then its cached use: client time to first audio), and deleted with `DeleteVoice`.
"""

from __future__ import annotations

import io
import shutil
import statistics
import subprocess
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

CHARS_PER_S = 14.0  # read English (the prompt set's spoken length: 0.9 frames of 80 ms a char)
SYNTH_RATE = 24000


def transcript(prompts: list[str], index: int, seconds: float) -> str:
    """Sentences of the prompt set, from a place of its own per voice, ~14 chars/s."""
    want = max(20, round(seconds * CHARS_PER_S))
    out: list[str] = []
    i = (index * 37) % len(prompts)
    while sum(len(s) + 1 for s in out) < want:
        out.append(prompts[i % len(prompts)])
        i += 1
    text = " ".join(out)
    return text if len(text) <= want else text[:want].rsplit(" ", 1)[0].rstrip(",;") + "."


def synth_speech(seconds: float, index: int, rate: int = SYNTH_RATE) -> np.ndarray:
    """A speech-like signal (float32, peak 0.5): harmonics of a moving pitch under two
    formants that change each syllable, syllables of 120-320 ms, pauses between words."""
    rng = np.random.default_rng(1000 + index)
    n = round(seconds * rate)
    f0 = 90.0 + 140.0 * ((index * 0.618034) % 1.0)  # each voice its own pitch, 90-230 Hz
    env = np.zeros(n, np.float32)
    f1 = np.empty(n, np.float32)
    f2 = np.empty(n, np.float32)
    pos, syl = 0, 0
    while pos < n:
        d = int(rng.uniform(0.12, 0.32) * rate)
        end = min(n, pos + d)
        f1[pos:end] = rng.uniform(300, 850)
        f2[pos:end] = rng.uniform(900, 2400)
        env[pos:end] = np.hanning(end - pos + 2)[1:-1] ** 0.7 * rng.uniform(0.6, 1.0)
        pos, syl = end, syl + 1
        if syl % int(rng.integers(2, 5)) == 0 and pos < n:  # a pause after a word
            gap = min(n, pos + int(rng.uniform(0.06, 0.25) * rate))
            f1[pos:gap], f2[pos:gap] = 500.0, 1500.0
            pos = gap
    k = max(1, rate // 400)  # formants glide over ~2.5 ms rather than jump
    kern = np.ones(k, np.float32) / k
    f1, f2 = np.convolve(f1, kern, "same"), np.convolve(f2, kern, "same")
    t = np.arange(n) / rate
    pitch = f0 * (1 + 0.08 * np.sin(2 * np.pi * 0.35 * t + index)
                  + 0.015 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    x = np.zeros(n, np.float64)
    for h in range(1, 40):
        fh = h * pitch
        amp = (np.exp(-((fh - f1) / 180.0) ** 2) + 0.6 * np.exp(-((fh - f2) / 250.0) ** 2)
               + 0.04) / h ** 0.5
        amp[fh > rate / 2 - 200] = 0.0
        x += amp * np.sin(h * phase)
    x = x * env + rng.normal(0, 0.004, n)  # a little breath
    return (0.5 * x / np.max(np.abs(x))).astype(np.float32)


def espeak_speech(text: str, seconds: float, index: int) -> tuple[np.ndarray, int]:
    """espeak-ng saying `text` (its own rate, 22050 Hz), looped or cut to `seconds`."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ref.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "165", "-p", str(30 + index * 7 % 50),
                        "-w", str(path), text], check=True, capture_output=True, timeout=60)
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
    x /= 32768.0
    n = round(seconds * rate)
    gap = np.zeros(int(0.3 * rate), np.float32)
    while len(x) < n:
        x = np.concatenate([x, gap, x])
    x = x[:n]
    return (0.5 * x / max(1e-6, float(np.max(np.abs(x))))).astype(np.float32), rate


def wav_bytes(x: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def audio_source(choice: str) -> str:
    if choice == "auto":
        return "espeak" if shutil.which("espeak-ng") else "synth"
    if choice == "espeak" and not shutil.which("espeak-ng"):
        raise RuntimeError("--clone-audio espeak: espeak-ng is not installed")
    return choice


def references(n: int, seconds: float, mode: str, source: str, prompts: list[str]
               ) -> list[dict[str, Any]]:
    """N references: {wav, rate, ref_text (in-context only), seconds}."""
    out = []
    for i in range(n):
        text = transcript(prompts, i, seconds)
        if source == "espeak":
            x, rate = espeak_speech(text, seconds, i)
        else:
            x, rate = synth_speech(seconds, i), SYNTH_RATE
        out.append({"wav": wav_bytes(x, rate), "rate": rate,
                    "ref_text": text if mode == "icl" else "", "seconds": len(x) / rate})
    return out


def _med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


async def first_audio_ms(stub: tts_pb2_grpc.TextToSpeechStub, voice: str, text: str,
                         seed: int, max_frames: int = 8) -> float:
    """One call at idle: client time from the config's write to the first audio frame;
    the call is cancelled then (its slot freed within a step)."""
    cfg = tts_pb2.SessionConfig(voice=voice, language="auto", seed=seed, frame_ms=20,
                                sample_rate=24000, session_id=f"probe-{voice}-{seed}")
    cfg.sampling.max_frames = max_frames
    call = stub.Synthesize()
    try:
        t0 = time.perf_counter()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=text)))
        await call.write(tts_pb2.SynthesizeRequest(
            control=tts_pb2.Control(type=tts_pb2.Control.FLUSH)))
        await call.done_writing()
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                raise RuntimeError(f"probe of {voice!r}: the stream ended without audio "
                                   f"({await call.code()})")
            if resp.WhichOneof("response") == "audio":
                return (time.perf_counter() - t0) * 1e3
    finally:
        call.cancel()


class ClonedVoices:
    """N library voices on a server, made, probed and deleted over its gRPC."""

    def __init__(self, addr: str, n: int, seconds: float, mode: str, audio: str,
                 prompts: list[str], prefix: str = "olclone") -> None:
        self.addr, self.n, self.seconds, self.mode = addr, n, seconds, mode
        self.source = audio_source(audio)
        self.prompts = prompts
        self.names = [f"{prefix}{i:03d}" for i in range(n)]
        self.created: list[str] = []
        self.info: dict[str, Any] = {"n": n, "seconds": seconds, "mode": mode,
                                     "audio": "espeak-ng" if self.source == "espeak"
                                     else "synthetic", "names": self.names}

    async def create(self) -> dict[str, Any]:
        refs = references(self.n, self.seconds, self.mode, self.source, self.prompts)
        self.info["sample_rate"] = refs[0]["rate"] if refs else None
        self.info["ref_text_chars"] = [len(r["ref_text"]) for r in refs]
        ms: list[float] = []
        async with grpc.aio.insecure_channel(self.addr) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            for name, r in zip(self.names, refs, strict=True):
                req = tts_pb2.CreateVoiceRequest(name=name, consent="bench", reference=(
                    tts_pb2.ReferenceAudio(audio=r["wav"], format=tts_pb2.ReferenceAudio.FORMAT_WAV,
                                           ref_text=r["ref_text"],
                                           x_vector_only=self.mode == "xvec")))
                try:
                    await stub.GetVoice(tts_pb2.GetVoiceRequest(name=name), timeout=30)
                    # left by a run cut short (a running server): made again, timed anew
                    await stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(name=name), timeout=30)
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                t = time.perf_counter()
                try:
                    resp = await stub.CreateVoice(req, timeout=300)
                except grpc.aio.AioRpcError as e:
                    raise RuntimeError(
                        f"CreateVoice {name}: {e.code().name} {e.details()!r} (it needs a "
                        "Base checkpoint's server with a TTS_VOICE_DIR)") from None
                ms.append(round((time.perf_counter() - t) * 1e3, 2))
                self.created.append(name)
                if resp.voice.kind != "clone":
                    raise RuntimeError(f"CreateVoice {name}: kind {resp.voice.kind!r}")
        self.info.update(create_ms=ms, create_ms_median=_med(ms),
                         create_ms_max=max(ms) if ms else None)
        return self.info

    async def probe(self, text: str = "Cloned voices speak the words of this sentence.",
                    uses: int = 2) -> dict[str, Any]:
        """Each voice `uses` times in a row, one call at a time: use 1 is its first."""
        per: dict[str, list[float]] = {}
        async with grpc.aio.insecure_channel(self.addr) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            for name in self.names:
                per[name] = [round(await first_audio_ms(stub, name, text, seed=u), 2)
                             for u in range(uses)]
        first = [v[0] for v in per.values()]
        cached = [x for v in per.values() for x in v[1:]]
        self.info.update(probe_ttfa_ms=per, first_use_ttfa_ms_median=_med(first),
                         cached_use_ttfa_ms_median=_med(cached))
        return self.info

    async def delete(self) -> None:
        async with grpc.aio.insecure_channel(self.addr) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            gone = 0
            for name in list(self.created):
                try:
                    await stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(name=name), timeout=30)
                    gone += 1
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                self.created.remove(name)
        self.info["deleted"] = gone


def voice_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.get("voice", "")] = out.get(r.get("voice", ""), 0) + 1
    return dict(sorted(out.items()))
