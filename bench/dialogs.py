"""The callers' side of bench/conversations.py: scripted dialogs of real speech.

A dialog is a caller's voice and speaking rate (espeak-ng: en-us, en-gb, en-us+f3,
en-gb+m3 at 150-190 wpm), its turns, and one interruption: every other turn has a pause
inside (two phrases joined by 400-700 ms of silence: "I would like to book a table" +
pause + "for two people tonight"), each turn is followed by a think time, and one turn's
reply is interrupted 0.5-1 s into its audio by a question ("Wait, what time is it in
Tokyo?") that must then be answered. Dialogs are drawn from a seed (`make_dialog`).

Speech is made once into a cache directory (16 kHz s16 WAVs named by a hash of text,
voice and rate), trimmed to its audible span (10 ms windows above -45 dBFS after peak
normalisation to -6 dBFS), so an utterance's sample marks are exact: its first speech
sample, its last one (the turn's true end: the clock of EoT -> first audio starts there)
and, for a paused turn, the silence inside (`Utterance`).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

RATE = 16000  # the mic's rate: what the caller sends
FRAME_SAMPLES = RATE // 50  # one 20 ms message
SPEECH_DBFS = -45.0  # a 10 ms window louder than this is speech
PEAK = 0.5  # speech is peak-normalised to -6 dBFS
VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3")
WPMS = (150, 160, 170, 180, 190)
PAUSE_MS = (400, 700)  # the silence inside a paused turn
BARGE_IN_AFTER_S = (0.5, 1.0)  # the interruption starts this far into a reply's audio
THINK_S = (0.3, 0.8)  # the caller's think time before each turn

PLAIN = (
    "What is the weather like today?",
    "How far is it from here to the station?",
    "What time does the museum open on Sunday?",
    "Can you recommend a good restaurant nearby?",
    "Please tell me a short story about the sea.",
    "How do I reset my password?",
    "Which train goes to the city centre?",
    "What should I cook for dinner tonight?",
    # complete, though they end on a word an unfinished turn often ends on: the word rule
    # held them ~3 s on the H200 sweep (2026-11-29's issue)
    "Which platform does the next train to Boston leave from?",
    "Could you call my sister at six?",
    "Is there a way to get there by bus?",
)
PAUSED = (
    ("I would like to book a table", "for two people tonight."),
    ("My flight number is", "seven four two to London."),
    ("Can you tell me", "the way to the nearest pharmacy?"),
    ("I need a taxi", "to the airport at six in the morning."),
    ("Please remind me", "to call my sister tomorrow."),
    ("I am looking for", "a hotel with a swimming pool."),
)
INTERRUPTS = (
    "Wait, what time is it in Tokyo?",
    "Sorry, what is the capital of Australia?",
    "Hold on, how much does the ticket cost?",
)


@dataclass(frozen=True)
class TurnScript:
    kind: str  # "plain", "paused" or "interrupt"
    phrases: tuple[str, ...]  # one, or two joined by the pause
    pause_ms: int = 0
    think_s: float = 0.0  # the caller waits this long before speaking (after the reply)
    ref: str = ""  # a turn folder's turn it was taken from (`folder_turns`)

    @property
    def text(self) -> str:
        return " ... ".join(self.phrases)


@dataclass(frozen=True)
class DialogScript:
    index: int
    voice: str
    wpm: int
    turns: tuple[TurnScript, ...]
    interrupt: TurnScript  # spoken over the reply to turns[barge_turn]
    barge_turn: int
    barge_in_after_s: float


@dataclass
class Utterance:
    """A turn's speech as the caller sends it: int16 at RATE, with sample marks."""

    pcm: np.ndarray
    speech_start: int = 0  # first speech sample
    speech_end: int = 0  # one past the last speech sample
    pause: tuple[int, int] | None = None  # the silence inside: [start, end) samples
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / RATE


def make_dialog(index: int, turns: int, seed: int = 0) -> DialogScript:
    """Caller `index`'s dialog: `turns` turns (every other one paused, alternating by
    caller), the reply of one of them interrupted. Deterministic in (index, turns, seed)."""
    if turns < 1:
        raise ValueError("a dialog has at least one turn")
    rng = random.Random(f"{seed}:{index}")
    plain, paused = list(PLAIN), list(PAUSED)
    rng.shuffle(plain)
    rng.shuffle(paused)
    script = []
    for i in range(turns):
        think = round(rng.uniform(*THINK_S), 3)
        if (i + index) % 2 == 1:
            script.append(TurnScript("paused", paused[i % len(paused)],
                                     rng.randint(*PAUSE_MS), think))
        else:
            script.append(TurnScript("plain", (plain[i % len(plain)],), 0, think))
    return DialogScript(
        index=index, voice=VOICES[index % len(VOICES)], wpm=rng.choice(WPMS),
        turns=tuple(script),
        interrupt=TurnScript("interrupt", (rng.choice(INTERRUPTS),), 0, 0.0),
        barge_turn=rng.randrange(turns),
        barge_in_after_s=round(rng.uniform(*BARGE_IN_AFTER_S), 3))


# -- audio ------------------------------------------------------------------------------------
def speech_span(x: np.ndarray, dbfs: float = SPEECH_DBFS) -> tuple[int, int]:
    """[first, last + 1) sample of the 10 ms windows louder than `dbfs` (x: float, +-1)."""
    win = RATE // 100
    n = len(x) // win
    if n == 0:
        raise ValueError("no audio")
    frames = x[: n * win].reshape(n, win).astype(np.float64)
    level = 10 * np.log10(np.mean(frames * frames, axis=1) + 1e-20)
    idx = np.flatnonzero(level >= dbfs)
    if len(idx) == 0:
        raise ValueError("the audio has no speech")
    return int(idx[0] * win), int((idx[-1] + 1) * win)


def trim(x: np.ndarray) -> np.ndarray:
    """Peak-normalised to PEAK and cut to its speech span (float32)."""
    x = x.astype(np.float32)
    x = x / max(float(np.max(np.abs(x))), 1e-9) * PEAK
    a, b = speech_span(x)
    return x[a:b]


def to_pcm16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


def join(phrases: list[np.ndarray], pause_ms: int = 0) -> Utterance:
    """Trimmed int16 phrases joined by `pause_ms` of silence: the utterance and its marks
    (speech from the first sample to the last; for two phrases, the pause between)."""
    if not phrases or any(len(p) == 0 for p in phrases):
        raise ValueError("empty phrase")
    if len(phrases) > 2:
        raise ValueError("at most two phrases (one pause)")
    gap = np.zeros(RATE * pause_ms // 1000, dtype=np.int16)
    pcm = np.concatenate([phrases[0], gap, phrases[1]]) if len(phrases) == 2 else phrases[0]
    pause = (len(phrases[0]), len(phrases[0]) + len(gap)) if len(phrases) == 2 else None
    return Utterance(pcm=pcm.astype(np.int16), speech_start=0, speech_end=len(pcm),
                     pause=pause)


def resample(x: np.ndarray, rate: int, to: int = RATE) -> np.ndarray:
    """Band-limited resampling (FFT), for short clips."""
    if rate == to:
        return x.astype(np.float32)
    n_out = round(len(x) * to / rate)
    spec = np.fft.rfft(x.astype(np.float64))
    keep = n_out // 2 + 1
    out = np.fft.irfft(spec[:keep] if keep <= len(spec) else
                       np.pad(spec, (0, keep - len(spec))), n_out)
    return (out * n_out / len(x)).astype(np.float32)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: not 16-bit PCM")
        x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        if w.getnchannels() > 1:
            x = x.reshape(-1, w.getnchannels())[:, 0]
        return x.astype(np.float32) / 32768.0, w.getframerate()


def write_wav(path: Path, pcm: np.ndarray, rate: int = RATE) -> None:
    tmp = path.with_suffix(".tmp")
    with wave.open(str(tmp), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype(np.int16).tobytes())
    tmp.replace(path)  # atomic: parallel runs share the cache


class SpeechCache:
    """espeak-ng phrases, made once: `cache_dir/<hash>.wav`, 16 kHz, trimmed."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir = Path(cache_dir)
        self._mem: dict[tuple[str, str, int], np.ndarray] = {}

    def path(self, text: str, voice: str, wpm: int) -> Path:
        key = hashlib.sha1(f"v1|{text}|{voice}|{wpm}".encode()).hexdigest()[:16]
        return self.dir / f"{key}.wav"

    def _make(self, text: str, voice: str, wpm: int) -> None:
        out = self.path(text, voice, wpm)
        if out.exists():
            return
        exe = shutil.which("espeak-ng")
        if exe is None:
            raise RuntimeError("espeak-ng is not installed (services/agent/setup.sh "
                               "installs it)")
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "raw.wav"
            p = subprocess.run([exe, "-v", voice, "-s", str(wpm), "-w", str(raw), text],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0 or not raw.exists():
                raise RuntimeError(f"espeak-ng failed ({voice}, {wpm} wpm, {text!r}): "
                                   f"{p.stderr.strip()}")
            x, rate = read_wav(raw)
        write_wav(out, to_pcm16(trim(resample(x, rate))))

    def make_all(self, items: set[tuple[str, str, int]], workers: int = 4) -> int:
        """Synthesise what is missing; returns how many were made."""
        self.dir.mkdir(parents=True, exist_ok=True)
        todo = sorted(i for i in items if not self.path(*i).exists())
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(lambda i: self._make(*i), todo))
        return len(todo)

    def phrase(self, text: str, voice: str, wpm: int) -> np.ndarray:
        key = (text, voice, wpm)
        if key not in self._mem:
            self._make(*key)
            x, _ = read_wav(self.path(*key))
            self._mem[key] = np.round(x * 32768.0).astype(np.int16)  # exact: as written
        return self._mem[key]


def needed(dialogs: list[DialogScript]) -> set[tuple[str, str, int]]:
    return {(p, d.voice, d.wpm) for d in dialogs for t in (*d.turns, d.interrupt)
            for p in t.phrases}


def render(turn: TurnScript, voice: str, wpm: int, cache: SpeechCache) -> Utterance:
    return join([cache.phrase(p, voice, wpm) for p in turn.phrases], turn.pause_ms)


def folder_turns(dialogs: list[DialogScript], folder: Path
                 ) -> tuple[list[DialogScript], list[list[Utterance]]]:
    """The dialogs with their turns taken from a turn folder (bench/turn_folder.py), say
    bench/turn_set.py's synthetic set, whose pauses are made inside one utterance (the
    words before them carry continuation prosody) in two synthesizer families: each paused
    turn is the folder's next unfinished turn (its pause where the folder says the speaker
    stopped and went on), each plain turn its next complete one, dealt in the folder's
    order. The interruption stays the dialog's (espeak-ng). `TurnScript.ref` names the
    folder's turn (its family and kind are in the folder)."""
    from bench.turn_folder import load_16k, read_folder

    turns = read_folder(folder)
    pools = {"plain": [t for t in turns if t.label == "complete"],
             "paused": [t for t in turns if t.label == "unfinished" and t.resume_s is not None]}
    if not pools["plain"] or not pools["paused"]:
        raise ValueError(f"{folder}: needs complete turns and unfinished ones with resume_s")
    dealt = {"plain": 0, "paused": 0}
    out_d: list[DialogScript] = []
    out_u: list[list[Utterance]] = []
    for d in dialogs:
        scripts, utts = [], []
        for tu in d.turns:
            pool = pools[tu.kind]
            t = pool[dealt[tu.kind] % len(pool)]
            dealt[tu.kind] += 1
            x = load_16k(folder / t.audio)
            first, end = speech_span(x)
            x = x[:end] / max(float(np.max(np.abs(x[:end]))), 1e-9) * PEAK
            pause = None
            if tu.kind == "paused":
                assert t.resume_s is not None
                pause = (round(t.stop_s * RATE), round(t.resume_s * RATE))
            utts.append(Utterance(pcm=to_pcm16(x), speech_start=first, speech_end=end,
                                  pause=pause))
            scripts.append(TurnScript(tu.kind, (t.text,), 0 if pause is None else
                                      round((pause[1] - pause[0]) * 1000 / RATE),
                                      tu.think_s, ref=t.id))
        out_d.append(DialogScript(d.index, d.voice, d.wpm, tuple(scripts), d.interrupt,
                                  d.barge_turn, d.barge_in_after_s))
        out_u.append(utts)
    return out_d, out_u
