"""The user's side of a case: speech made by espeak-ng (or a supplied WAV), at 16 kHz.

espeak-ng is a real formant synthesizer, so Silero VAD hears speech in it: the agent's
endpointing, barge-in and STT run on a real signal. The text may carry SSML
(`<break time="600ms"/>` for a mid-utterance pause: the stutter case). The clip is
peak-normalised to `gain_db`, padded with lead and tail silence (the tail is what lets
the VAD see the end of turn), and optionally mixed with noise at `noise_snr_db`.

`end_of_speech_s` is where the last audible speech ends inside the clip: the user
bot turns it into the EoT moment (clip start + end_of_speech_s) that Ring2 measures
from. Noise is deterministic (seeded by the case id).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .audio import read_wav, resample
from .audio_metrics import envelope_db
from .cases import Input

USER_RATE = 16000
SPEECH_DBFS = -45.0  # a 10 ms window louder than this is speech (clean espeak output)


@dataclass
class UserClip:
    audio: np.ndarray  # float32 mono at USER_RATE
    end_of_speech_s: float  # last speech sample, seconds from the clip's start
    speech_start_s: float

    @property
    def duration_s(self) -> float:
        return len(self.audio) / USER_RATE

    def pcm16(self) -> np.ndarray:
        return np.clip(np.round(self.audio * 32768.0), -32768, 32767).astype(np.int16)


def espeak(text: str, voice: str = "en-us", wpm: int = 165) -> tuple[np.ndarray, int]:
    """Run espeak-ng; returns (float samples, rate). Raises RuntimeError with the reason."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed (services/autortc/setup.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        proc = subprocess.run([exe, "-v", voice, "-s", str(wpm), "-m", "-w", str(out), text],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"espeak-ng failed for voice {voice!r}: {proc.stderr.strip()}")
        return read_wav(out)


def _speech_span(x: np.ndarray, rate: int) -> tuple[float, float]:
    env = envelope_db(x, rate)
    idx = np.flatnonzero(env >= SPEECH_DBFS)
    if len(idx) == 0:
        raise ValueError("the input has no audible speech")
    return idx[0] / 100.0, (idx[-1] + 1) / 100.0


def _noise(n: int, seed: str) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16))
    white = rng.standard_normal(n)
    # A gentle low-pass (first-order) makes it less hissy, more like room noise.
    pink = np.empty(n)
    acc = 0.0
    for i, v in enumerate(white):
        acc = 0.97 * acc + 0.03 * v * 6.0
        pink[i] = acc
    return (pink / max(np.std(pink), 1e-9)).astype(np.float32)


def make_clip(inp: Input, *, base_dir: Path | None = None, seed: str = "") -> UserClip:
    """The case's user speech as a 16 kHz clip with its end-of-speech mark."""
    if inp.text is not None:
        raw, rate = espeak(inp.text, inp.voice, inp.speed_wpm)
    else:
        raw, rate = read_wav((base_dir or Path(".")) / str(inp.wav))
    speech = resample(raw, rate, USER_RATE)
    start, end = _speech_span(speech, USER_RATE)
    speech = speech[int(start * USER_RATE) : int(end * USER_RATE)]
    peak = float(np.max(np.abs(speech)))
    speech = speech / max(peak, 1e-6) * 10 ** (inp.gain_db / 20)
    lead = np.zeros(USER_RATE * inp.lead_silence_ms // 1000, dtype=np.float32)
    tail = np.zeros(USER_RATE * inp.tail_silence_ms // 1000, dtype=np.float32)
    audio = np.concatenate([lead, speech.astype(np.float32), tail])
    if inp.noise_snr_db is not None:
        s_rms = float(np.sqrt(np.mean(np.square(speech)))) if len(speech) else 0.0
        audio = audio + _noise(len(audio), seed) * s_rms * 10 ** (-inp.noise_snr_db / 20)
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    return UserClip(audio=audio, speech_start_s=len(lead) / USER_RATE,
                    end_of_speech_s=(len(lead) + len(speech)) / USER_RATE)


def make_barge_in(text: str, voice: str = "en-us", gain_db: float = -6.0) -> UserClip:
    return make_clip(Input(text=text, voice=voice, gain_db=gain_db, lead_silence_ms=0,
                           tail_silence_ms=600))
