"""TTS engine benchmark: streaming TTFA, RTF, real-time capacity, step split, memory.

Random weights at a released shape (`--preset 0.6b`), every stream forced to exactly
`--frames` codec frames (EOS suppressed, as the peer's bench does with min_new_tokens),
`c` streams started together for each concurrency in `--concurrency`. Per stream:
- TTFA: text pushed + flushed -> first audio packet out of the engine;
- RTF: text pushed -> last packet, over the audio length;
- lateness: how far each packet arrives behind a player that started at the first
  packet (a stream is real time when no packet is more than 100 ms late).
Prints a table and writes JSON (`--out`). `--grpc` adds client-side figures through a
real `voice_tts.server` on localhost. Runs on CPU too (`--preset tiny --device cpu`).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineSettings,
    SamplingParams,
    SessionParams,
    StepStats,
    UtteranceEnd,
)

TEXT = ("The quick brown fox jumps over the lazy dog while the orchestra tunes up; "
        "a voice agent has to answer in well under half a second to feel natural.")
FRAME_S = 0.08


@dataclass
class Stream:
    t_push: float = 0.0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, first_frame)
    frames: int = 0
    timings: dict = field(default_factory=dict)  # the engine's split of the first packet
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, item: object) -> None:
        if isinstance(item, AudioPacket):
            self.arrivals.append((time.perf_counter(), item.first_frame))
            self.timings = item.timings or self.timings
            self.frames += item.frames
        elif isinstance(item, UtteranceEnd):
            self.done.set()

    def ttfa(self) -> float:
        return self.arrivals[0][0] - self.t_push

    def rtf(self) -> float:
        return (self.arrivals[-1][0] - self.t_push) / (self.frames * FRAME_S)

    def max_late(self) -> float:
        t0 = self.arrivals[0][0]
        return max(t - (t0 + first * FRAME_S) for t, first in self.arrivals)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_level(engine: Engine, c: int, frames: int, seed: int) -> dict:
    steps: list[StepStats] = []
    engine.on_step = steps.append
    streams = [Stream() for _ in range(c)]
    sessions = [engine.open_session(SessionParams(voice=engine.voices()[0].name, seed=seed + i,
                                                  sampling=SamplingParams(), max_frames=frames),
                                    sink=s.sink) for i, s in enumerate(streams)]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for st, sess in zip(streams, sessions, strict=True):
        st.t_push = time.perf_counter()
        sess.push_text(TEXT)
        sess.flush()
    for st in streams:
        st.done.wait(600)
    for sess in sessions:
        sess.close()
    engine.on_step = None
    ok = [s for s in streams if s.arrivals]
    if not ok:
        raise RuntimeError(f"c={c}: no stream produced audio (see the engine's log above)")
    ttfa = [s.ttfa() for s in ok]
    rtf = [s.rtf() for s in ok]
    late = [s.max_late() for s in ok]
    full = [x for x in steps if x.batch_size == c] or steps
    return {
        "concurrency": c, "frames": frames, "streams_ok": len(ok),
        "frames_out": sum(s.frames for s in ok),
        "ttfa_ms_p50": 1e3 * pct(ttfa, 0.5), "ttfa_ms_p95": 1e3 * pct(ttfa, 0.95),
        # TTFA's split: waiting for a prefill slot, the prefill (engine side).
        "queue_ms_p50": pct([s.timings.get("queue_ms", 0.0) for s in ok], 0.5),
        "prefill_ms_p50": pct([s.timings.get("prefill_ms", 0.0) for s in ok], 0.5),
        "rtf_p50": pct(rtf, 0.5), "rtf_p95": pct(rtf, 0.95),
        "max_late_ms": 1e3 * max(late), "realtime_streams": sum(x <= 0.1 for x in late),
        # Means over the steps with every stream in the batch; part times are GPU time.
        "step_ms": statistics.fmean(x.step_ms for x in full),
        "talker_ms": statistics.fmean(x.talker_ms for x in full),
        "code_predictor_ms": statistics.fmean(x.code_predictor_ms for x in full),
        "decoder_ms": statistics.fmean(x.decoder_ms for x in full),
        "emit_ms": statistics.fmean(x.emit_ms for x in full),
        "gpu_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available()
        else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="0.6b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--frames", type=int, default=120, help="codec frames per stream (80 ms)")
    p.add_argument("--concurrency", default="1,4,16,32,64")
    p.add_argument("--first-packet-frames", type=int, default=1)
    p.add_argument("--packet-frames", type=int, default=4)
    p.add_argument("--decoder-precision", default="auto",
                   choices=["auto", "fp32", "tf32", "bf16"])
    p.add_argument("--max-prefills", type=int, default=EngineSettings.max_prefills_per_step,
                   help="prompts prefilled per engine iteration (a burst of c prompts takes "
                        "c / this iterations)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    levels = [int(x) for x in args.concurrency.split(",")]
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    t0 = time.perf_counter()
    engine = Engine.from_preset(args.preset, seed=0, device=args.device, dtype=dtype,
                                settings=EngineSettings(
                                    max_sessions=max(levels), max_batch=max(levels),
                                    first_packet_frames=args.first_packet_frames,
                                    packet_frames=args.packet_frames,
                                    decoder_precision=args.decoder_precision,
                                    max_seq_len=args.frames + 256,
                                    max_prefills_per_step=args.max_prefills,
                                    # Fixed-length streams: never sample codec EOS (the
                                    # peer's min_new_tokens = max_new_tokens).
                                    ignore_eos=True))
    engine.start()
    build_s = time.perf_counter() - t0
    print(json.dumps({"stage": "build", "s": round(build_s, 1), "preset": args.preset,
                      "decoder_precision": args.decoder_precision,
                      "device": str(args.device), "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else ""}),
          flush=True)
    run_level(engine, 1, 8, seed=999)  # warm-up
    results = []
    for c in levels:
        run_level(engine, c, 8, seed=555)  # warm the batch shape
        r = run_level(engine, c, args.frames, seed=0)
        results.append(r)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}),
              flush=True)
    engine.shutdown()
    print(f"\n{'c':>4} {'TTFA p50':>9} {'TTFA p95':>9} {'RTF p50':>8} {'RTF p95':>8} "
          f"{'prefill':>8} {'late max':>9} {'RT':>5} {'step':>7} {'talker':>7} {'cp':>7} "
          f"{'dec':>7} {'mem':>6}")
    for r in results:
        print(f"{r['concurrency']:>4} {r['ttfa_ms_p50']:>7.1f}ms {r['ttfa_ms_p95']:>7.1f}ms "
              f"{r['rtf_p50']:>8.3f} {r['rtf_p95']:>8.3f} {r['prefill_ms_p50']:>6.1f}ms "
              f"{r['max_late_ms']:>7.0f}ms "
              f"{r['realtime_streams']:>2}/{r['concurrency']:<2} {r['step_ms']:>6.1f}ms "
              f"{r['talker_ms']:>6.1f}ms {r['code_predictor_ms']:>6.1f}ms "
              f"{r['decoder_ms']:>6.1f}ms {r['gpu_mem_gb']:>5.1f}G")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"preset": args.preset, "device": args.device, "build_s": build_s,
                       "decoder_precision": args.decoder_precision,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
