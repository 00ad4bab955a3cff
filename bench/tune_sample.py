"""Time the fused sampling kernel per warp count on the GPU (not in CI): the code
predictor samples 15 times per frame, so its per-call latency is on the critical path.

  PYTHONPATH=services/tts/src:. python -m bench.tune_sample

Prints us per call (CUDA graph of 100 back-to-back calls) for vocabularies 2048 (code
predictor) and 3072 (talker) at batch 1 and 64, and the fastest warps per vocabulary.
"""

from __future__ import annotations

import argparse

import torch
from voice_tts.engine import kernels
from voice_tts.engine.kernels import sampling as ks
from voice_tts.engine.sampling import SamplingTensors


def time_us(fn, calls: int = 100, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warps", default="1,2,4,8")
    args = p.parse_args()
    dev = torch.device("cuda")
    best = {}
    for v in (2048, 3072):
        for b in (1, 64):
            slots = torch.arange(b, device=dev)
            params = SamplingTensors(
                do_sample=torch.ones(b, dtype=torch.bool, device=dev),
                temperature=torch.full((b,), 0.9, device=dev),
                top_k=torch.full((b,), 50, dtype=torch.long, device=dev),
                top_p=torch.ones(b, device=dev))
            seed = torch.arange(b, device=dev)
            count = torch.zeros(b, dtype=torch.long, device=dev)
            logits = torch.randn(b, v, device=dev, dtype=torch.bfloat16) * 4
            args_ = (logits, slots, params, seed, count, 0, 1)
            ref = None
            row = []
            for w in (int(x) for x in args.warps.split(",")):
                ks.WARPS[triton_vp(v)] = w
                out = kernels.sample(*args_)
                ref = out.clone() if ref is None else ref
                assert torch.equal(out, ref), "warps change the tokens"
                us = time_us(lambda a=args_: kernels.sample(*a))
                row.append((us, w))
                if b == 1:
                    best.setdefault(triton_vp(v), []).append((us, w))
            print(f"V={v} B={b}: " + "  ".join(f"{w} warps {us:.1f} us" for us, w in row))
    print("WARPS =", {vp: min(r)[1] for vp, r in best.items()})


def triton_vp(v: int) -> int:
    return 1 << (v - 1).bit_length()


if __name__ == "__main__":
    main()
