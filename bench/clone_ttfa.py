"""Time to first audio of cloned voices on one GPU (random 0.6B Base weights, graphs on):
an x-vector clone (a preset-sized prompt) vs in-context clones with 10 s and 30 s
references (prompts of ~140 and ~390 rows, the speech decoder primed with 125 / 375
frames). Text flushed at once; median of n utterances one at a time (idle engine).

    python3 -m bench.clone_ttfa [--preset 0.6b-base] [--n 20]

H100, n 15 (median first-packet wall / prefill ms): x-vector 8.7 / 1.1; in-context 10 s
11.6 / 4.4, 30 s 13.8 / 6.5 with the primed decoder state kept per voice (the first
utterance of a voice, decoding its reference eagerly: 25.1 / 16.8 and 36.6 / 19.8).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
from voice_tts.engine import AudioPacket, Engine, EngineSettings, SessionParams, UtteranceEnd
from voice_tts.engine.voices import VoicePrompt

TEXT = "Cloned voices speak the words of a target sentence."
REF_TEXT = "The reference recording says these words, more or less, for some seconds."


def first_packet(engine: Engine, voice: str, seed: int) -> dict[str, float]:
    got, done, out = threading.Event(), threading.Event(), {}

    def sink(ev) -> None:
        if isinstance(ev, AudioPacket) and not got.is_set():
            out.update(ev.timings or {}, wall_ms=(time.perf_counter() - t0) * 1e3)
            got.set()
        elif isinstance(ev, UtteranceEnd):
            done.set()

    s = engine.open_session(SessionParams(voice=voice, seed=seed, max_frames=4), sink)
    t0 = time.perf_counter()
    s.push_text(TEXT)
    s.flush()
    assert done.wait(60)
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="0.6b-base")
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    engine = Engine.from_preset(args.preset, device="cuda", settings=EngineSettings(
        max_sessions=16, max_batch=16, max_prefills_per_step=16))
    rng, hidden = np.random.default_rng(0), engine.cfg.talker.hidden_size
    xvec = rng.standard_normal(hidden).astype(np.float32)
    engine.add_voice("xvec", VoicePrompt(x_vector=xvec))
    for seconds in (10, 30):
        engine.add_voice(f"icl{seconds}", VoicePrompt(
            x_vector=xvec, ref_codes=rng.integers(0, 2048, (int(seconds * 12.5), 16)),
            ref_text=REF_TEXT))
    engine.start()
    for voice in ("xvec", "icl10", "icl30"):
        first_packet(engine, voice, 0)  # warm-up
        runs = [first_packet(engine, voice, i) for i in range(args.n)]
        print(json.dumps({"voice": voice, **{k: round(float(np.median([r[k] for r in runs])), 2)
                                            for k in ("wall_ms", "prefill_ms", "queue_ms")}}))
    print("prefill graph replays:", engine.runner.prefill_graphs.replays)
    engine.shutdown()


if __name__ == "__main__":
    main()
