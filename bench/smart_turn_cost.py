"""What one Smart Turn v3.2 decision costs on this host's CPU, alone and in a batch.

`voice_agent.smart_turn` runs the model for all the conversations of a process in one
worker thread, a batch at a time: one decision is one clip's features (numpy: STFT and
mel of 8 s) and its share of one `session.run`. This prints, for each batch size, the
wall time of the features, of the model run and of both, per batch and per clip, on one
intra-op thread (`--threads`; the agent's AGENT_SMART_TURN_THREADS) and OpenBLAS held to
one thread, with a median over `--reps` rounds after one warm-up. The clips are
speech-like noise of 1-12 s (the cost does not depend on the audio: always 8 s in).

    .venv/agent/bin/python -m bench.smart_turn_cost
    .venv/agent/bin/python -m bench.smart_turn_cost --batches 1,8,64 --reps 5 --threads 2
"""

from __future__ import annotations

import argparse
import os

# before numpy loads: the features' matmul stays on this thread, as the bench says
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def clips(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = np.arange(int((1 + i % 12) * 16000)) / 16000
        envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 2
        out.append((rng.standard_normal(len(t)) * 0.1 * envelope).astype(np.float32))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,64", help="batch sizes (comma-separated)")
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per batch size")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--model", default="", help="the ONNX file (default: fetch's place)")
    args = parser.parse_args()

    import onnxruntime as ort
    from voice_agent import smart_turn

    model = smart_turn.SmartTurn(args.model or smart_turn.default_path(), args.threads)
    print(f"Smart Turn v3.2 ({model.path.name}, pipecat-ai=={smart_turn.PIPECAT_VERSION}), "
          f"onnxruntime {ort.__version__}, numpy {np.__version__}, {args.threads} intra-op "
          f"thread(s), {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"median of {args.reps} after 1 warm-up")
    print(f"{'batch':>5} {'features ms':>12} {'model ms':>9} {'total ms':>9} "
          f"{'per clip ms':>12}")
    for b in (int(x) for x in args.batches.split(",")):
        windows = np.stack([smart_turn.last_8s(c) for c in clips(b)])
        feats, runs = [], []
        for _ in range(args.reps + 1):
            t0 = time.perf_counter()
            x = smart_turn.features_batch(windows)
            t1 = time.perf_counter()
            model.session.run(None, {"input_features": x})
            t2 = time.perf_counter()
            feats.append(t1 - t0)
            runs.append(t2 - t1)
        f, r = statistics.median(feats[1:]) * 1e3, statistics.median(runs[1:]) * 1e3
        print(f"{b:>5} {f:>12.1f} {r:>9.1f} {f + r:>9.1f} {(f + r) / b:>12.2f}")


if __name__ == "__main__":
    main()
