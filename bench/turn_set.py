"""A synthetic set of labelled turns for bench/turn_eval.py, offline and deterministic.

Two synthesizer families, balanced: espeak-ng (formant; several voices, 140-210 words a
minute) and flite (CMU Flite 2.2, diphone `kal`/`kal16` and clustergen `awb`/`rms`/`slt`,
`duration_stretch` 0.85-1.2). Labels (the sentences: bench/turn_texts.py):
- complete: statements and questions, some ending on a stranded preposition or particle;
- unfinished: a pause of 300-900 ms made INSIDE one utterance, so the words before it are
  spoken as the start of a longer sentence (continuation prosody), never a sentence of
  its own. espeak-ng: SSML `<break time="..."/>` (`-m`). flite: its SSML `<break/>`
  makes a phrase break (the words before it lengthened and phrased as a non-final
  phrase) but a fixed ~0.2 s silence whatever its `time`; the break's silence is found
  from flite's own segment timings (`-psdur`: the break's `pau`) and set to the pause's
  length. Both: the silence between the two loud 10 ms windows is replaced by digital
  zeros of the pause's length. Limits: the prosody at the break is each synthesizer's
  comma-like phrase break (no hesitation lengthening beyond it); a comma before the
  pause ("eggs, milk, | and bread") makes its own short pause, which is not judged;
- backchannel ("mm-hmm", "yeah", ...), and noise: white bursts and cough-like bursts
  (band-passed noise, sharp attack, decay), made with numpy.
Every turn's stop_s / resume_s is located from its audio by energy (turn_folder.py), then
1 s of silence follows its speech. Written as a turn folder (turn_folder.py), 16 kHz.

  python -m bench.turn_set --out /tmp/turnset --n 400      # ~10 s on 2 cores
  python -m bench.turn_set --out /tmp/dialogset --from-dialogs 128   # the sweep's callers
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.turn_folder import (
    RATE,
    WINDOW_S,
    Turn,
    loud_windows,
    quiet_runs,
    read_wav,
    speech_end_s,
    to_16k,
    write_turn,
)
from bench.turn_texts import BACKCHANNEL, COMPLETE, UNFINISHED, split_pause

ESPEAK_VOICES = ["en-us", "en-gb", "en-us+f3", "en+m3", "en-gb-scotland", "en-gb-x-rp",
                 "en-029", "en-us+f2"]
ESPEAK_RATES = [140, 160, 175, 190, 210]  # words a minute
FLITE_VOICES = ["kal", "kal16", "awb", "rms", "slt"]  # kal: 8 kHz (a resampled family member)
FLITE_STRETCH = [0.85, 0.95, 1.0, 1.1, 1.2]
FAMILIES = ("espeak-ng", "flite")
PAUSES_S = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
TAIL_S = 1.0  # silence after the last speech: room for any VAD hangover
LEAD_S = 0.25  # before a noise burst
# the label mix: the rest of n is split between complete and unfinished
SHARE = {"backchannel": 0.1, "noise": 0.1}
EXE = {"espeak-ng": "espeak-ng", "flite": "flite"}
INSTALL = "apt-get install -y flite espeak-ng (services/agent/setup.sh test)"


@dataclass(frozen=True)
class Plan:
    """One turn to make."""
    id: str
    label: str
    kind: str
    family: str  # espeak-ng | flite | noise
    voice: str
    rate: float  # espeak-ng: words a minute; flite: duration_stretch; noise: 0
    text: str  # an unfinished turn's with its `|`
    pause_s: float | None  # unfinished: the silence made at `|`
    seed: int


def plan(n: int, seed: int) -> list[Plan]:
    """n turns: 10 % backchannel, 10 % noise, the rest complete/unfinished; each label's
    speech half from each family; voices, rates and pauses drawn from `seed`."""
    rng = random.Random(seed)
    counts = {k: round(n * s) for k, s in SHARE.items()}
    rest = n - sum(counts.values())
    counts["complete"] = rest // 2
    counts["unfinished"] = rest - rest // 2
    pools = {"complete": [(k, t) for k, ts in COMPLETE.items() for t in ts],
             "unfinished": [(k, t) for k, ts in UNFINISHED.items() for t in ts],
             "backchannel": [("backchannel", t) for t in BACKCHANNEL]}
    plans: list[Plan] = []
    for label in ("complete", "unfinished", "backchannel", "noise"):
        if label == "noise":
            items = [("cough" if i % 2 else "burst", "", "noise") for i in range(counts[label])]
        else:  # half a family (the odd one to the first), sentences in shuffled rounds
            items = []
            for f, family in enumerate(FAMILIES):
                want = counts[label] // 2 + (f < counts[label] % 2)
                got: list[tuple[str, str, str]] = []
                while len(got) < want:
                    rng.shuffle(pools[label])
                    got += [(k, t, family) for k, t in pools[label]]
                items += got[:want]
        for kind, text, family in items:
            if family == "espeak-ng":
                voice, rate = rng.choice(ESPEAK_VOICES), float(rng.choice(ESPEAK_RATES))
            elif family == "flite":
                voice, rate = rng.choice(FLITE_VOICES), rng.choice(FLITE_STRETCH)
            else:
                voice, rate = kind, 0.0
            pause = rng.choice(PAUSES_S) if label == "unfinished" else None
            plans.append(Plan(f"{len(plans):04d}-{label}", label, kind, family, voice, rate,
                              text, pause, rng.randrange(2 ** 31)))
    return plans


# --- synthesis -----------------------------------------------------------------------------

def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit(f"turn_set: {cmd[0]} not found: {INSTALL}") from None


def espeak(text: str, voice: str, wpm: float, tmp: Path) -> tuple[np.ndarray, list[float]]:
    """16 kHz int16 speech; `|` -> a long SSML break (cut to length later). Also the
    break's time, unknown here: []."""
    ssml = text.replace("|", '<break time="1500ms"/>')
    path = tmp / "e.wav"
    _run(["espeak-ng", "-m", "-v", voice, "-s", str(int(wpm)), "-w", str(path),
          f"<speak>{ssml}</speak>"])
    pcm, rate = read_wav(path)
    return to_16k(pcm, rate), []


def flite(text: str, voice: str, stretch: float, tmp: Path) -> tuple[np.ndarray, list[float]]:
    """16 kHz int16 speech; `|` -> an SSML break. Also the break's (start, end) seconds
    from flite's segment timings: the `pau` of the break among the phrase breaks."""
    path, src = tmp / "f.wav", tmp / "f.xml"
    src.write_text(f"<speak>{text.replace('|', '<break/>')}</speak>")
    out = _run(["flite", "-voice", voice, "--setf", f"duration_stretch={stretch}", "-ssml",
                "-f", str(src), "-o", str(path), "-psdur"])
    pcm, rate = read_wav(path)
    span: list[float] = []
    if "|" in text:
        ends = [(name, float(t)) for name, t in
                (seg.rsplit(":", 1) for seg in out.split() if ":" in seg)]
        paus = [(ends[i - 1][1], end) for i, (name, end) in enumerate(ends)
                if name == "pau" and 0 < i < len(ends) - 1]
        before, _ = split_pause(text)
        # flite breaks a phrase at each , ; : and at the <break/> (one pau where they meet)
        index = sum(before.rstrip(",;:").count(c) for c in ",;:")
        if index >= len(paus):
            raise RuntimeError(f"flite {voice}: {len(paus)} phrase breaks in {text!r}, "
                               f"the pause is break {index + 1}")
        span = list(paus[index])
    return to_16k(pcm, rate), span


def set_pause(pcm: np.ndarray, near: list[float], pause_s: float) -> tuple[np.ndarray, int]:
    """The pause's silence (between two loud windows) made `pause_s` long, and the window
    where it starts: the quiet run that overlaps `near` (flite's break) most, else the
    longest one (espeak-ng's 1.5 s)."""
    runs = quiet_runs(loud_windows(pcm))
    if not runs:
        raise RuntimeError("no pause found in the speech")
    if near:
        lo, hi = (round(t / WINDOW_S) for t in near)
        a, b = max(runs, key=lambda r: min(r[1], hi) - max(r[0], lo))
        if min(b, hi) - max(a, lo) <= 0:
            raise RuntimeError(f"no quiet run at the break {near}")
    else:
        a, b = max(runs, key=lambda r: r[1] - r[0])
    w = int(RATE * WINDOW_S)
    return np.concatenate([pcm[:a * w], np.zeros(round(pause_s * RATE), np.int16),
                           pcm[b * w:]]), a


def noise(kind: str, seed: int) -> np.ndarray:
    """A noise burst the VAD may take for speech: `burst` (white, 80-300 ms, raised-cosine
    envelope) or `cough` (300-3000 Hz noise, 10 ms attack, ~80 ms decay, sometimes two)."""
    rng = np.random.default_rng(seed)
    if kind == "burst":
        n = int(rng.uniform(0.08, 0.3) * RATE)
        x = rng.standard_normal(n) * np.hanning(n)
    else:
        parts = []
        for _ in range(1 + int(rng.random() < 0.4)):
            n = int(rng.uniform(0.2, 0.35) * RATE)
            spec = np.fft.rfft(rng.standard_normal(n))
            hz = np.fft.rfftfreq(n, 1 / RATE)
            spec[(hz < 300) | (hz > 3000)] = 0
            t = np.arange(n) / RATE
            env = np.minimum(t / 0.01, 1) * np.exp(-t / rng.uniform(0.05, 0.11))
            parts += [np.fft.irfft(spec, n) * env, np.zeros(int(0.12 * RATE))]
        x = np.concatenate(parts)
    peak = 10 ** (rng.uniform(-20, -8) / 20) * 32767
    return np.round(x / np.abs(x).max() * peak).astype(np.int16)


def make(p: Plan) -> tuple[Turn, np.ndarray]:
    """One planned turn -> (its labels, 16 kHz int16 audio)."""
    with tempfile.TemporaryDirectory(prefix="turn_set-") as d:
        if p.family == "noise":
            pcm = np.concatenate([np.zeros(int(LEAD_S * RATE), np.int16), noise(p.kind, p.seed)])
        else:
            synth = espeak if p.family == "espeak-ng" else flite
            pcm, near = synth(p.text, p.voice, p.rate, Path(d))
            if p.pause_s is not None:
                pcm, at = set_pause(pcm, near, p.pause_s)
    end = speech_end_s(pcm)
    pcm = np.concatenate([pcm[:round(end * RATE)], np.zeros(int(TAIL_S * RATE), np.int16)])
    stop_s, resume_s = end, None
    if p.pause_s is not None:
        # located again in the final audio: the quiet run where the pause was made
        a, b = next(r for r in quiet_runs(loud_windows(pcm)) if r[0] <= at < r[1])
        stop_s, resume_s = a * WINDOW_S, b * WINDOW_S
        assert abs(resume_s - stop_s - p.pause_s) < 0.015, (p, stop_s, resume_s)
    extra = {"rate": p.rate} if p.family != "noise" else {}
    turn = Turn(id=p.id, audio=f"{p.id}.wav", label=p.label, stop_s=round(stop_s, 3),
                resume_s=None if resume_s is None else round(resume_s, 3),
                text=p.text.replace(" |", ""), kind=p.kind, family=p.family, voice=p.voice,
                source="synthetic", extra=extra)
    return turn, pcm


def build(out: Path, n: int, seed: int, jobs: int | None = None) -> list[Turn]:
    """The set in `out` (created; its old turns replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.suffix in (".wav", ".json") and f.stem[:4].isdigit():
            f.unlink()
    plans = plan(n, seed)
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:  # the synths are processes
        made = list(pool.map(make, plans))
    for turn, pcm in made:
        write_turn(out, turn, pcm)
    return [t for t, _ in made]


def from_dialogs(out: Path, callers: int, seed: int, speech_dir: Path) -> list[Turn]:
    """The conversation sweep's callers (bench/dialogs.py, bench/conversations.py's
    `--turns 3 --seed`) as a turn folder: each plain and interrupting question, and each
    paused turn's end, a complete turn; each paused turn's pause an unfinished one. Its
    two parts are spoken separately (each a sentence's prosody), unlike this set's."""
    from bench.dialogs import SpeechCache, make_dialog, needed, render

    dialogs = [make_dialog(i, 3, seed) for i in range(callers)]
    cache = SpeechCache(speech_dir)
    cache.make_all(needed(dialogs))
    out.mkdir(parents=True, exist_ok=True)
    turns, seen = [], set()
    for d in dialogs:
        for script in (*d.turns, d.interrupt):
            if (script, d.voice, d.wpm) in seen:
                continue
            seen.add((script, d.voice, d.wpm))
            u = render(script, d.voice, d.wpm, cache)
            pcm = np.concatenate([u.pcm, np.zeros(int(TAIL_S * RATE), np.int16)])
            marks = [("complete", u.speech_end / RATE, None)]
            extra: dict[str, Any] = {"rate": d.wpm}
            if u.pause is not None:
                marks.append(("unfinished", u.pause[0] / RATE, u.pause[1] / RATE))
                # the complete turn holds the labelled pause: not one of its inner silences
                extra["pause_s"] = [round(u.pause[0] / RATE, 3), round(u.pause[1] / RATE, 3)]
            for label, stop_s, resume_s in marks:
                tid = f"{len(turns):04d}-dialog-{label}"
                turn = Turn(id=tid, audio=f"{tid}.wav", label=label, stop_s=round(stop_s, 3),
                            resume_s=None if resume_s is None else round(resume_s, 3),
                            text=script.text, kind=f"dialog-{script.kind}",
                            family="espeak-ng", voice=d.voice, source="synthetic",
                            extra=extra if label == "complete" else {"rate": d.wpm})
                write_turn(out, turn, pcm)
                turns.append(turn)
    return turns


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.turn_set", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the folder to write")
    ap.add_argument("--n", type=int, default=400, help="how many turns (default 400)")
    ap.add_argument("--seed", type=int, default=0, help="voices, rates, pauses (default 0)")
    ap.add_argument("--jobs", type=int, default=None, help="synthesizers at once (cores)")
    ap.add_argument("--from-dialogs", type=int, default=0, metavar="CALLERS",
                    help="instead: the conversation sweep's first CALLERS callers' turns "
                    "(bench/dialogs.py; espeak-ng phrases spoken separately)")
    ap.add_argument("--speech-dir", type=Path, default=Path("bench/out/conversation_speech"),
                    help="the sweep's phrase cache (--from-dialogs)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    turns = (from_dialogs(a.out, a.from_dialogs, a.seed, a.speech_dir) if a.from_dialogs
             else build(a.out, a.n, a.seed, a.jobs))
    mix = Counter((t.label, t.family) for t in turns)
    print(f"turn_set: {len(turns)} turns in {a.out} ({time.perf_counter() - t0:.1f} s): "
          + ", ".join(f"{lab}/{fam} {c}" for (lab, fam), c in sorted(mix.items())),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
