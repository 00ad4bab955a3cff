"""Turn-taking measured offline on a folder of labelled turns: the synthetic set of
bench/turn_set.py, the page's feedback recordings (AGENT_FEEDBACK_DIR), your own.

The folder (bench/turn_folder.py reads it): `<id>.wav` (mono 16-bit PCM, any rate) and
`<id>.json`: {"audio": "<id>.wav", "label": "complete"|"unfinished"|"backchannel"|"noise",
"stop_s": where the speaker stopped (the end of the last word before the silence judged),
"resume_s": unfinished: where they went on (null: unknown; any end is then a cut-off),
"text", "kind", "family" ("espeak-ng"|"flite"|"recorded"|...), "voice", "source"
("synthetic"|"feedback"), "decision" (optional: what the agent decided)}.

For every turn, at the VAD's decision point (stop_s + the VAD's hangover, `--vad-silence-ms`):
1. the transcript the agent's offline ear (Moonshine tiny-en, as voice_agent/sphinx.py's
   worker hears an utterance) writes of the audio up to that point, with how sure it was
   of their end (`Heard`); cached in the output's folder (`<out>.transcripts.json`),
   keyed by the turn and its audio;
2. each detector's p_end on (that transcript, that audio as float32 16 kHz), the agent's
   own detectors (voice_agent/conversation/turn_end.py): `vad` (silence alone: p = 1),
   `text` (the word rule, and the ear's doubt at `--ear-min-end`/`--ear-min-last`),
   `audio` (Smart Turn v3.2) and `fused`; the audio two are
   skipped, with a note, when voice_agent.smart_turn or its model cannot load;
3. per min delay, the wait after stop_s and what it costs (bench/turn_report.py):
   unfinished turns cut off, complete turns' latency and long holds, backchannels and
   noise taken as a turn; split by family, kind and source. Every number carries its
   source ("synthetic" for the synthetic set) in the table and the JSON;
4. the silences inside a turn's speech before stop_s (a comma's pause, a stop's closure)
   at least the hangover long, judged the same way on the ear's words up to each: a turn
   is "cut inside" when one of them outlasts its wait (what a shorter hangover costs).

Runs in the agent's venv (it imports voice_agent):

  .venv/agent/bin/python -m bench.turn_set --out /tmp/turnset
  .venv/agent/bin/python -m bench.turn_eval /tmp/turnset --out result.json --plot result.png

The plot needs matplotlib (not in the agent's venv; `.venv/autortc/bin/python`, which
installs the agent, has it); without it the run says so and writes the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.turn_folder import RATE, FolderError, Turn, load_16k, quiet_runs, read_folder
from bench.turn_report import plot, source_of, summarize, table

DETECTORS = ("vad", "text", "audio", "fused")
MIN_DELAYS = "0.05,0.1,0.15,0.2,0.3,0.4,0.5,0.7,1.0"
EAR = "moonshine tiny-en with its end and last-word probabilities (voice_agent.sphinx, " \
      "1 thread a process)"


# --- the ear -------------------------------------------------------------------------------

_transcribe: Callable[[bytes], Any] | None = None


def _ear_init() -> None:
    global _transcribe
    from voice_agent.sphinx import _moonshine  # the worker's own: trim, whole VAD hops

    _transcribe = _moonshine(1)


def _ear(pcm: bytes) -> list[Any]:
    assert _transcribe is not None
    heard = _transcribe(pcm)
    return [heard.text, heard.p_end, heard.p_last]


def cut(audio: np.ndarray, turn: Turn, hangover_s: float) -> np.ndarray:
    """The turn's audio up to the VAD's decision (zeros past the file's end)."""
    n = round((turn.stop_s + hangover_s) * RATE)
    return np.pad(audio[:n], (0, max(0, n - len(audio))))


def inner_gaps(audio: np.ndarray, turn: Turn, hangover_s: float) -> list[tuple[float, float]]:
    """(start, length) s of the silences inside the speech before `stop_s` at least the
    hangover long: the VAD ends speech there too, and the detector decides. Silence as
    the agent reads it (voice_agent.speech_end: 10 ms windows under -45 dBFS)."""
    from voice_agent.speech_end import SPEECH_DBFS, WINDOW_S

    n = int(RATE * WINDOW_S)
    k = min(len(audio), round(turn.stop_s * RATE)) // n
    db = 10 * np.log10(np.maximum((audio[:k * n].astype(np.float64).reshape(k, n) ** 2)
                                  .mean(axis=1), 1e-12))
    labelled = turn.extra.get("pause_s")  # a pause the folder judges as its own turn
    return [(a * WINDOW_S, (b - a) * WINDOW_S) for a, b in quiet_runs(db >= SPEECH_DBFS)
            if (b - a) * WINDOW_S >= hangover_s - 1e-9 and not (
                labelled and a * WINDOW_S < labelled[1] and b * WINDOW_S > labelled[0])]


def _key(turn_id: str, audio: np.ndarray) -> str:
    return f"{turn_id}@{hashlib.sha1(audio.tobytes()).hexdigest()[:16]}"


def transcripts(ids: list[str], clips: list[np.ndarray], cache: Path,
                jobs: int) -> list[Any]:
    """The ear's words of each clip (voice_agent.sphinx.Heard), from `cache` where it
    has them (an older cache's bare text is heard again)."""
    from voice_agent.sphinx import Heard

    try:
        known = json.loads(cache.read_text())["items"] if cache.is_file() else {}
    except (json.JSONDecodeError, KeyError):
        known = {}
    keys = [_key(i, c) for i, c in zip(ids, clips, strict=True)]
    todo = [i for i, k in enumerate(keys) if not isinstance(known.get(k), list)]
    if todo:
        pcm = [(np.clip(clips[i], -1, 1) * 32767).astype(np.int16).tobytes() for i in todo]
        # spawned: the parent may hold ONNX Runtime sessions and threads already
        with ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                 initializer=_ear_init) as pool:
            for i, text in zip(todo, pool.map(_ear, pcm, chunksize=4), strict=True):
                known[keys[i]] = text
        cache.write_text(json.dumps({"ear": EAR, "items": known}, indent=0))
    return [Heard(*known[k]) for k in keys]


# --- the detectors -------------------------------------------------------------------------

class _Memo:
    """One Smart Turn answer per clip for `audio` and `fused` alike."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.seen: dict[str, float] = {}

    async def predict(self, audio: np.ndarray) -> float:
        key = hashlib.sha1(audio.tobytes()).hexdigest()
        if key not in self.seen:
            self.seen[key] = await self.model.predict(audio)
        return self.seen[key]


def load_detectors(names: list[str], explicit: bool, settings: Any = None,
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: detector (None: vad)} and {name: why skipped}. An asked-for detector that
    cannot load is an error when `explicit`, else a note. `settings`: the agent's (its
    ear thresholds), AgentSettings() if None."""
    from voice_agent.conversation.turn_end import (
        AudioDetector,
        FusedDetector,
        WordDetector,
        make_detector,
    )
    from voice_agent.settings import AgentSettings

    settings = settings or AgentSettings()
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    model = None
    for name in names:
        if name not in DETECTORS:
            raise SystemExit(f"turn_eval: unknown detector {name!r}; one of {DETECTORS}")
        if name in ("vad", "text"):
            out[name] = make_detector(settings, name)
            continue
        try:
            if model is None:
                from voice_agent import smart_turn

                model = _Memo(smart_turn.load(settings.smart_turn_model,
                                              settings.smart_turn_threads))
        except Exception as e:  # not written yet, no onnxruntime, no model file
            if explicit:
                raise SystemExit(f"turn_eval: the {name} detector cannot load: {e}") from None
            skipped[name] = f"{type(e).__name__}: {e}"
            continue
        out[name] = AudioDetector(model) if name == "audio" else FusedDetector(
            model, WordDetector(settings.turn_ear_min_end, settings.turn_ear_min_last))
    return out, skipped


async def p_ends(detectors: dict[str, Any], heards: list[Any],
                 clips: list[np.ndarray]) -> dict[str, list[float]]:
    """Each detector's p_end per turn; one detector at a time (the audio model batches
    its clips), `vad` 1.0 (silence alone ends the turn)."""
    from voice_agent.conversation.turn_end import TurnView

    out: dict[str, list[float]] = {}
    for name, det in detectors.items():
        if det is None:
            out[name] = [1.0] * len(heards)
            continue
        views = [TurnView(h.text, c, ear=h) for h, c in zip(heards, clips, strict=True)]
        out[name] = [float(p) for p in await asyncio.gather(*(det.p_end(v) for v in views))]
    return out


# --- the run -------------------------------------------------------------------------------

def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def evaluate(folder: Path, out: Path, detectors: list[str] | None = None,
             min_delays: list[float] | None = None, max_delay: float = 1.0,
             hangover_s: float = 0.2, jobs: int | None = None,
             short: tuple[int, float] = (2, 0.35),
             ear: tuple[float, float] | None = None) -> dict[str, Any]:
    """The whole run: rows per turn, the summary, the conditions; written to `out` (the
    ear's cache beside it). `ear`: the (min end, min last word) probabilities under which
    the ear's words are in doubt; None: the agent's defaults."""
    from voice_agent.settings import AgentSettings

    t0 = time.perf_counter()
    if out.resolve().parent == folder.resolve():
        raise FolderError(f"{out}: put the output outside the turn folder {folder} (a json "
                          "in it is read as a turn)")
    turns = read_folder(folder)
    min_delays = min_delays or [float(m) for m in MIN_DELAYS.split(",")]
    settings = AgentSettings(**({} if ear is None else
                                {"turn_ear_min_end": ear[0], "turn_ear_min_last": ear[1]}))
    dets, skipped = load_detectors(list(detectors or DETECTORS), detectors is not None,
                                   settings)
    audios = [load_16k(folder / t.audio) for t in turns]
    clips = [cut(a, t, hangover_s) for a, t in zip(audios, turns, strict=True)]
    # the silences inside the speech the VAD also ends: (turn index, start, length)
    gaps = [(i, *g) for i, (a, t) in enumerate(zip(audios, turns, strict=True))
            if t.label in ("complete", "unfinished") for g in inner_gaps(a, t, hangover_s)]
    ids = [t.id for t in turns] + [f"{turns[i].id}#{at:.2f}" for i, at, _ in gaps]
    clips += [audios[i][:round((at + hangover_s) * RATE)] for i, at, _ in gaps]
    out.parent.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    heards = transcripts(ids, clips, out.with_suffix(".transcripts.json"),
                         jobs or min(2, os.cpu_count() or 1))
    t2 = time.perf_counter()
    ps = asyncio.run(p_ends(dets, heards, clips))
    t3 = time.perf_counter()
    rows = [{"id": t.id, "label": t.label, "kind": t.kind, "family": t.family,
             "voice": t.voice, "source": t.source, "text": t.text, "stop_s": t.stop_s,
             "resume_s": t.resume_s, "transcript": heards[i].text,
             "ear": {"p_end": heards[i].p_end, "p_last": heards[i].p_last},
             "p_end": {d: round(ps[d][i], 4) for d in dets}, "inner": []}
            for i, t in enumerate(turns)]
    for j, (i, at, length) in enumerate(gaps, start=len(turns)):
        rows[i]["inner"].append({"at_s": round(at, 3), "gap_s": round(length, 3),
                                 "transcript": heards[j].text,
                                 "p_end": {d: round(ps[d][j], 4) for d in dets}})
    source = source_of(rows)
    result = {
        "source": source,
        "folder": str(folder),
        "conditions": {
            "vad_silence_s": hangover_s, "max_delay_s": max_delay, "min_delays_s": min_delays,
            "threshold": 0.5, "ear": EAR, "detectors": list(dets), "skipped": skipped,
            "short_turn": {"words": short[0], "delay_s": short[1]},
            "ear_doubt": {"min_end": settings.turn_ear_min_end,
                          "min_last": settings.turn_ear_min_last},
            "wait": "max(vad_silence_s, min_delay if p_end >= 0.5 else max_delay) after "
                    "stop_s; a complete turn of <= short_turn.words words: >= its delay_s",
            "inner": "each silence inside a turn's speech (10 ms windows under -45 dBFS) "
                     ">= vad_silence_s is judged too, on the ear's words up to it + "
                     "vad_silence_s; the turn is cut inside when a wait is shorter",
            "host": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
            "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
        },
        "counts": {f"{lab}/{fam}": c for (lab, fam), c in
                   sorted(Counter((t.label, t.family) for t in turns).items())},
        "sources": dict(Counter(t.source or "unknown" for t in turns)),
        "seconds": {"load": round(t1 - t0, 1), "ear": round(t2 - t1, 1),
                    "detectors": round(t3 - t2, 1)},
        "summary": summarize(rows, list(dets), min_delays, max_delay, hangover_s, short),
        "turns": rows,
    }
    out.write_text(json.dumps(result, indent=1))
    return result


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated seconds expected, got {s!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.turn_eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a folder of <id>.wav + <id>.json turns")
    ap.add_argument("--detectors", default=None,
                    help=f"comma-separated, of {','.join(DETECTORS)} (default: all that load)")
    ap.add_argument("--min-delays", type=_floats, default=_floats(MIN_DELAYS),
                    help=f"the min endpointing delays to try, s (default {MIN_DELAYS})")
    ap.add_argument("--max-delay", type=float, default=1.0,
                    help="the wait of a held turn, s (default 1.0, the agent's)")
    ap.add_argument("--vad-silence-ms", type=int, default=None,
                    help="the VAD's hangover: no decision before it (default "
                    "AGENT_VAD_SILENCE_MS's)")
    ap.add_argument("--short-turn-words", type=int, default=2,
                    help="a complete turn of at most this many words waits --short-turn-delay"
                    " (default 2, the agent's; 0: off)")
    ap.add_argument("--short-turn-delay", type=float, default=0.35,
                    help="that wait, s (default 0.35, the agent's)")
    ap.add_argument("--ear-min-end", type=float, default=None,
                    help="the ear's words are in doubt under this end probability "
                    "(default AGENT_TURN_EAR_MIN_END's; 0: off)")
    ap.add_argument("--ear-min-last", type=float, default=None,
                    help="... or under this last-word probability (default "
                    "AGENT_TURN_EAR_MIN_LAST's; 0: off)")
    ap.add_argument("--out", type=Path, default=Path("result.json"),
                    help="the JSON (default result.json); the ear's cache sits beside it")
    ap.add_argument("--plot", type=Path, default=None, help="a PNG (needs matplotlib)")
    ap.add_argument("--jobs", type=int, default=None, help="ear processes (default <= 2)")
    a = ap.parse_args(argv)
    names = a.detectors.split(",") if a.detectors else None
    from voice_agent.settings import AgentSettings

    d = AgentSettings()  # the agent's defaults, for what the command line leaves unset
    if a.vad_silence_ms is None:
        a.vad_silence_ms = d.vad_silence_ms
    ear = None
    if a.ear_min_end is not None or a.ear_min_last is not None:
        ear = (d.turn_ear_min_end if a.ear_min_end is None else a.ear_min_end,
               d.turn_ear_min_last if a.ear_min_last is None else a.ear_min_last)
    try:
        result = evaluate(a.folder, a.out, names, a.min_delays, a.max_delay,
                          a.vad_silence_ms / 1e3, a.jobs,
                          (a.short_turn_words, a.short_turn_delay), ear)
    except FolderError as e:
        raise SystemExit(f"turn_eval: {e}") from None
    for name, why in result["conditions"]["skipped"].items():
        print(f"turn_eval: {name} skipped ({why})", file=sys.stderr)
    print(table(result["summary"], result["source"]))
    secs = result["seconds"]
    print(f"\n{len(result['turns'])} turns ({result['source']}); load {secs['load']} s, "
          f"ear {secs['ear']} s, detectors {secs['detectors']} s -> {a.out}")
    if a.plot:
        if plot(result["summary"], result["source"], a.plot):
            print(f"plot -> {a.plot}")
        else:
            print("turn_eval: matplotlib is not importable; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
