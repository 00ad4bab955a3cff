"""Offline: when the ear's early pass would start (prepare) and when speech ends, under the
current gate (Silero p <= 0.35) and a sooner one (p < 0.5), on synthetic turns. A model of
speech_end.py's reading (Silero windows, the caller's silence from 10 ms windows under
-45 dBFS), not the agent's code:

    .venv/agent/bin/python bench/results/2026-11-29-decision-150-gpu/prepare_timing.py \\
        /tmp/dialogset /tmp/turnset
"""
import collections
import sys
from pathlib import Path

import numpy as np
from livekit.plugins.silero.onnx_model import OnnxModel, new_inference_session

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.turn_folder import load_16k, read_folder

RATE, HOP = 16000, 512
WIN = HOP / RATE
PASS_S = 0.05  # the ear's pass on an idle core
ACT, DEACT = 0.5, 0.35  # Silero's start and deactivation thresholds (the agent's)
HANGOVER, PREPARE, MIN_SPEECH = 0.2, 0.06, 0.064
SESSION = new_inference_session(force_cpu=True)


def loud(a: np.ndarray) -> np.ndarray:
    n = 160
    k = len(a) // n
    x = a[:k * n].astype(np.float64).reshape(k, n)
    return 10 * np.log10(np.maximum((x ** 2).mean(1), 1e-12)) >= -45.0


def run(a: np.ndarray, gate: float) -> tuple[list, list, int]:
    """(prepares, ends, passes undone): each a (window time, last loud time)."""
    model = OnnxModel(onnx_session=SESSION, sample_rate=RATE)
    windows = loud(a)
    speaking, speech, prepared = False, 0.0, False
    preps, ends, undone = [], [], 0
    for i in range(len(a) // HOP):
        p = model(a[i * HOP:(i + 1) * HOP].astype(np.float32))
        t = (i + 1) * WIN
        idx = np.flatnonzero(windows[:int(t / 0.01)])
        last = (idx[-1] + 1) * 0.01 if len(idx) else 0.0
        quiet = t - last
        if not speaking:
            speech = speech + WIN if p >= ACT else 0.0
            speaking, prepared = speech >= MIN_SPEECH, False
            continue
        if p >= ACT and prepared and quiet < 0.03:
            prepared, undone = False, undone + 1  # the user went on
        if p <= gate and quiet >= PREPARE and not prepared:
            prepared = True
            preps.append((t, last))
        if p <= DEACT and quiet >= HANGOVER:
            ends.append((t, last))
            speaking, speech = False, 0.0
    return preps, ends, undone


def main() -> None:
    out = collections.defaultdict(list)
    for folder in sys.argv[1:]:
        for turn in read_folder(Path(folder)):
            if turn.label != "complete":
                continue
            a = load_16k(Path(folder) / turn.audio)
            for name, gate in (("now", DEACT), ("sooner", ACT - 1e-4)):
                preps, ends, undone = run(a, gate)
                if not ends:
                    continue
                t_end, last = ends[-1]
                mine = [p for p in preps if p[1] == last]  # the pass for this end
                out[(Path(folder).name, turn.family, name)].append({
                    "end": t_end - last, "prep": mine[-1][0] - last if mine else None,
                    "ready": bool(mine) and t_end - mine[-1][0] - PASS_S >= 0,
                    "preps": len(preps), "undone": undone, "ends": len(ends)})
    for key, rows in sorted(out.items()):
        n = len(rows)
        prep = sorted(r["prep"] for r in rows if r["prep"] is not None)
        end = sorted(r["end"] for r in rows)
        print(key, n, f"prepare after the last word p50 {prep[len(prep) // 2] * 1e3:.0f} ms,",
              f"end p50 {end[n // 2] * 1e3:.0f} ms, pass ready by the end",
              f"{sum(r['ready'] for r in rows)}/{n}, passes a turn",
              f"{sum(r['preps'] for r in rows) / n:.2f}, undone",
              f"{sum(r['undone'] for r in rows) / n:.2f}")


if __name__ == "__main__":
    main()
