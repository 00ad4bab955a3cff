"""The page's opt-in turn-taking feedback ("you cut me off", "too slow"), kept for tuning.

A saved turn is a pair in AGENT_FEEDBACK_DIR, the folder bench/turn_eval.py reads:
`<id>.wav`, mono 16-bit PCM at 16 kHz (the turn's last <= 8 s as the end-of-turn detector
heard it), and `<id>.json`: the label ("unfinished": the agent cut the user off;
"complete": the turn was over and the agent waited too long), where in the wav the
speech stopped, the transcript and the agent's decision. Ids sort by time.

Each file is written under a hidden temporary name and renamed, the wav first and the json
last, so a reader that lists the json files never meets half a pair; off the event loop
(one thread at a time per recorder). Past AGENT_FEEDBACK_MAX_MB the oldest pairs go.
Only files named as pairs are counted or deleted: a folder shared with other files keeps
them. Disabled (AGENT_FEEDBACK_DIR empty), nothing is ever written.

Knows nothing of sockets or of a door's words for the labels (talk/ maps its "cut_off"
to "unfinished").
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import secrets
import threading
import time
import wave
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prometheus_client import Counter

from .conversation.turn_end import Decision
from .metrics import REGISTRY

RATE = 16000  # the Decision's audio rate
LABELS = ("unfinished", "complete")  # bench/turn_eval.py's: the turn was not over / was over
MB = 1_000_000
STALE_S = 60.0  # a temporary file or a wav without its json this old: a crashed write's

# <id>: UTC time to the microsecond (sorts as it was saved) and a random tail (two
# conversations in the same microsecond)
PAIR = re.compile(r"(?P<id>\d{8}T\d{12}Z-[0-9a-f]{6})\.(?:wav|json)")

SAVED = Counter("agent_feedback_saved_total", "Turns saved by the page's feedback buttons "
                "(unfinished: \"you cut me off\"; complete: \"too slow\")", ["label"],
                registry=REGISTRY)
for _label in LABELS:  # exported at 0 before the first save
    SAVED.labels(label=_label)


class FeedbackDisabled(RuntimeError):
    """A save asked of a disabled recorder (AGENT_FEEDBACK_DIR empty)."""


class FeedbackRecorder:
    """Pairs of (wav, json) in `folder`, at most `max_mb` MB of them; "" = disabled."""

    def __init__(self, folder: str | Path, max_mb: int) -> None:
        self.dir = Path(folder) if str(folder) else None
        self.max_bytes = max_mb * MB
        self._lock = threading.Lock()  # one write and trim at a time (the threads' order)
        if self.dir is None:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".probe-{secrets.token_hex(4)}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValueError(
                f"AGENT_FEEDBACK_DIR={str(folder)!r} cannot be created or written "
                f"({e.strerror or e}): make it a folder the agent may write, or leave "
                "AGENT_FEEDBACK_DIR empty (feedback off)") from None
        self._remove_leftovers()

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    async def save(self, decision: Decision, label: str, session_id: str,
                   pair_id: str | None = None) -> str:
        """Saves `decision` with `label` (one of LABELS) off the event loop; returns the
        pair's id. `pair_id`: rewrite that pair (the same turn relabelled)."""
        return await asyncio.to_thread(self.save_sync, decision, label, session_id, pair_id)

    def save_sync(self, decision: Decision, label: str, session_id: str,
                  pair_id: str | None = None) -> str:
        if self.dir is None:
            raise FeedbackDisabled("feedback is off (AGENT_FEEDBACK_DIR is empty)")
        if label not in LABELS:
            raise ValueError(f"feedback label {label!r} is not one of {LABELS}")
        audio = decision.audio
        if audio is None or not len(audio):
            raise ValueError("the decision kept no audio of the turn")
        now = datetime.now(UTC)
        pair_id = pair_id or f"{now:%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(3)}"
        stop_s = decision.stop_s if decision.stop_s is not None else len(audio) / RATE
        meta = {
            "audio": f"{pair_id}.wav", "label": label, "stop_s": round(float(stop_s), 4),
            "resume_s": None, "text": decision.transcript, "kind": "feedback",
            "family": "recorded", "voice": "", "source": "feedback",
            "decision": {"detector": decision.detector, "p_end": float(decision.p_end),
                         "wait_s": float(decision.wait_s), "fallback": decision.fallback,
                         "session_id": session_id,
                         "saved_at": now.isoformat(timespec="milliseconds")},
        }
        wav_path, json_path = self.dir / f"{pair_id}.wav", self.dir / f"{pair_id}.json"
        with self._lock:
            fresh = not wav_path.exists()  # else relabelled: the same turn's audio
            try:
                if fresh:
                    _write_atomic(wav_path, wav_bytes(audio))
                _write_atomic(json_path, json.dumps(meta, ensure_ascii=False,
                                                    indent=1).encode())
            except BaseException:
                if fresh:  # no wav without its json
                    with contextlib.suppress(OSError):
                        wav_path.unlink(missing_ok=True)
                raise
            self._trim(keep=pair_id)
        SAVED.labels(label=label).inc()
        return pair_id

    def pairs(self) -> list[str]:
        """The ids of the pairs in the folder, oldest first."""
        if self.dir is None:
            return []
        return sorted({m["id"] for f in self.dir.iterdir()
                       if (m := PAIR.fullmatch(f.name)) and f.name.endswith(".json")})

    def _trim(self, keep: str) -> None:
        """The oldest pairs (and any half pair) go until the folder is under max_bytes;
        `keep`, the newest, stays whatever its size."""
        assert self.dir is not None
        sizes: dict[str, int] = {}
        for f in self.dir.iterdir():
            if m := PAIR.fullmatch(f.name):
                with contextlib.suppress(FileNotFoundError):  # another agent's trim
                    sizes[m["id"]] = sizes.get(m["id"], 0) + f.stat().st_size
        total = sum(sizes.values())
        for pair_id in sorted(sizes):
            if total <= self.max_bytes or pair_id == keep:
                break
            for ext in ("json", "wav"):  # the json first: the reader's index
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / f"{pair_id}.{ext}").unlink()
            total -= sizes[pair_id]

    def _remove_leftovers(self) -> None:
        """At start: what a crash mid-write left (a reader takes a wav without its json
        for a broken folder)."""
        assert self.dir is not None
        now = time.time()
        for f in self.dir.iterdir():
            half = PAIR.fullmatch(f.name) and f.suffix == ".wav" and \
                not f.with_suffix(".json").exists()
            if half or (f.name.startswith(".") and f.name.endswith(".tmp")):
                with contextlib.suppress(OSError):
                    if now - f.stat().st_mtime > STALE_S:
                        f.unlink()


def wav_bytes(audio: np.ndarray) -> bytes:
    """float32 at 16 kHz -> a mono 16-bit PCM WAV file."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, all or nothing: a hidden temporary file, synced, then renamed."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
