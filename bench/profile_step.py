"""Where one engine step's time goes: torch.profiler over a few steps of c streams.

  python -m bench.profile_step --preset 0.6b --concurrency 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile
from voice_tts.engine import Engine, EngineSettings, SamplingParams, SessionParams

from bench.run import TEXT, Stream


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="0.6b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (per-op kernel times)")
    args = p.parse_args()
    engine = Engine.from_preset(args.preset, device=args.device, settings=EngineSettings(
        max_sessions=args.concurrency, max_batch=args.concurrency, max_seq_len=512,
        cuda_graphs=not args.eager, ignore_eos=True))
    print("dtype", next(engine.model.parameters()).dtype, "device", engine.device)
    streams = [Stream() for _ in range(args.concurrency)]
    for i, st in enumerate(streams):
        s = engine.open_session(SessionParams(voice=engine.voices()[0].name, seed=i,
                                              sampling=SamplingParams(), max_frames=200), st.sink)
        s.push_text(TEXT)
        s.flush()
    for _ in range(6):  # prefill + warm-up steps
        engine.run_once()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            engine.run_once()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / args.steps * 1e3
    print(f"wall per step: {wall:.2f} ms (c={args.concurrency})")
    if torch.cuda.is_available():
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / args.steps
        print(f"kernels per step: {len(kernels) / args.steps:.0f}, "
              f"GPU busy {busy:.2f} ms of {wall:.2f} ms")
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15,
                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
