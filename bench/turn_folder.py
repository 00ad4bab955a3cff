"""A folder of labelled turns: the format bench/turn_set.py writes, the page's feedback
recorder saves (voice_agent/feedback.py) and bench/turn_eval.py reads.

One turn is a pair `<id>.wav` (mono 16-bit PCM, any rate) + `<id>.json`:

    {"audio": "<id>.wav",
     "label": "complete" | "unfinished" | "backchannel" | "noise",
     "stop_s": 1.23,      # where the speaker stopped: the end of the last word before
                          # the silence being judged (seconds into the wav)
     "resume_s": 1.83,    # unfinished: where they went on; null: unknown (any end cuts)
     "text": "...", "kind": "after-to", "family": "espeak-ng" | "flite" | "recorded" | ...,
     "voice": "en-us", "source": "synthetic" | "feedback",
     "decision": {...}}   # optional: what the agent decided (feedback recordings)

One silence is judged per turn: the one after `stop_s`. Hidden files (the recorder's
temporary `.name.tmp`) are skipped. Here too: reading a wav at 16 kHz, and locating
speech in it by energy (the synthetic set's stop_s / resume_s).
"""

from __future__ import annotations

import io
import json
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RATE = 16000
LABELS = ("complete", "unfinished", "backchannel", "noise")
WINDOW_S = 0.010  # energy windows
# A 10 ms window is speech when its RMS is within LOUD_DB of the clip's loudest window
# and above FLOOR_DBFS: the weak end of a fricative ("...bus") is ~30 dB under a vowel,
# synthetic silence is digital zero.
LOUD_DB = 40.0
FLOOR_DBFS = -60.0


class FolderError(ValueError):
    """A turn in the folder that cannot be read; the message names the file."""


@dataclass
class Turn:
    """One labelled turn (the json's fields; `id` is its file name's stem)."""
    id: str
    audio: str
    label: str
    stop_s: float
    resume_s: float | None
    text: str = ""
    kind: str = ""
    family: str = ""
    voice: str = ""
    source: str = ""
    decision: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields this reader doesn't know

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("id")
        extra = d.pop("extra")
        if d["decision"] is None:
            d.pop("decision")
        return {**d, **extra}


_REQUIRED = {"audio": (str, "a string"), "label": (str, "a string"),
             "stop_s": ((int, float), "a number")}
_OPTIONAL = {"text": str, "kind": str, "family": str, "voice": str, "source": str}


def parse_turn(path: Path) -> Turn:
    """`<id>.json` -> Turn, or FolderError naming the file and what is wrong."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FolderError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(meta, dict):
        raise FolderError(f"{path}: a JSON object expected, got {type(meta).__name__}")
    for key, (kind, what) in _REQUIRED.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise FolderError(f"{path}: {key!r} missing or not {what}")
    if meta["label"] not in LABELS:
        raise FolderError(f"{path}: label {meta['label']!r} is not one of {LABELS}")
    resume = meta.get("resume_s")
    if resume is not None and (not isinstance(resume, (int, float)) or resume < meta["stop_s"]):
        raise FolderError(f"{path}: resume_s {resume!r} must be null or a number >= stop_s")
    if meta["stop_s"] < 0:
        raise FolderError(f"{path}: stop_s {meta['stop_s']} is negative")
    for key, kind in _OPTIONAL.items():
        if key in meta and meta[key] is not None and not isinstance(meta[key], kind):
            raise FolderError(f"{path}: {key!r} must be a string")
    known = {*_REQUIRED, *_OPTIONAL, "resume_s", "decision"}
    return Turn(id=path.stem, audio=meta["audio"], label=meta["label"],
                stop_s=float(meta["stop_s"]),
                resume_s=None if resume is None else float(resume),
                **{k: meta.get(k) or "" for k in _OPTIONAL},
                decision=meta.get("decision"),
                extra={k: v for k, v in meta.items() if k not in known})


def read_folder(folder: Path) -> list[Turn]:
    """Every turn of `folder`, sorted by id; FolderError for a bad json, a missing wav, or
    a wav without its json."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    visible = [p for p in folder.iterdir() if not p.name.startswith(".")]
    turns = [parse_turn(p) for p in sorted(visible) if p.suffix == ".json"]
    named = {t.audio for t in turns}
    for t in turns:
        if not (folder / t.audio).is_file():
            raise FolderError(f"{folder / (t.id + '.json')}: its audio {t.audio!r} is missing")
    for p in visible:
        if p.suffix == ".wav" and p.name not in named:
            raise FolderError(f"{p}: no {p.stem}.json labels it")
    if not turns:
        raise FolderError(f"{folder}: no <id>.json turns in it")
    return turns


def write_turn(folder: Path, turn: Turn, pcm16k: np.ndarray) -> None:
    """The pair, the wav first (a reader that lists the json files never meets half)."""
    (folder / turn.audio).write_bytes(wav_bytes(pcm16k, RATE))
    (folder / f"{turn.id}.json").write_text(json.dumps(turn.to_json(), indent=1) + "\n")


# --- audio ---------------------------------------------------------------------------------

def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(pcm, np.int16).tobytes())
    return buf.getvalue()


def read_wav(data: bytes | Path, name: str = "") -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV -> (mono int16, rate); channels averaged."""
    name = name or str(data)
    try:
        with wave.open(io.BytesIO(data) if isinstance(data, bytes) else str(data), "rb") as w:
            if w.getsampwidth() != 2:
                raise FolderError(f"{name}: {8 * w.getsampwidth()}-bit samples, 16-bit PCM only")
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
            pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1).astype(np.int16)
            return pcm, w.getframerate()
    except (wave.Error, EOFError) as e:
        raise FolderError(f"{name}: not a PCM WAV ({e})") from None


def to_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    """int16 at `rate` -> int16 at 16 kHz: FFT resampling (an ideal low-pass; the clips
    start and end in silence, so its circular edges do no harm), deterministic."""
    if rate == RATE or not len(pcm):
        return np.asarray(pcm, np.int16)
    n_out = round(len(pcm) * RATE / rate)
    spec = np.fft.rfft(pcm.astype(np.float64))
    keep = min(len(spec), n_out // 2 + 1)
    y = np.fft.irfft(spec[:keep], n_out) * (n_out / len(pcm))
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


def load_16k(path: Path) -> np.ndarray:
    """A turn's wav as float32 at 16 kHz in [-1, 1)."""
    pcm, rate = read_wav(path)
    return to_16k(pcm, rate).astype(np.float32) / 32768.0


def loud_windows(pcm16k: np.ndarray) -> np.ndarray:
    """(n_windows,) bool: the 10 ms windows that hold speech (LOUD_DB, FLOOR_DBFS)."""
    n = int(RATE * WINDOW_S)
    k = len(pcm16k) // n
    x = np.asarray(pcm16k[:k * n], np.float64).reshape(k, n) / 32768.0
    db = 10 * np.log10(np.maximum((x ** 2).mean(axis=1), 1e-12))
    if not k:
        return np.zeros(0, bool)
    return db >= max(db.max() - LOUD_DB, FLOOR_DBFS)


def quiet_runs(loud: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) window indices of the quiet runs between the first and last loud
    window (pauses inside the speech)."""
    idx = np.flatnonzero(loud)
    if len(idx) < 2:
        return []
    gaps = np.flatnonzero(np.diff(idx) > 1)
    return [(int(idx[g]) + 1, int(idx[g + 1])) for g in gaps]


def speech_end_s(pcm16k: np.ndarray) -> float:
    """The end of the last loud window (the clip's stop_s); 0 for a silent clip."""
    idx = np.flatnonzero(loud_windows(pcm16k))
    return float((idx[-1] + 1) * WINDOW_S) if len(idx) else 0.0
