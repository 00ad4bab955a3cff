"""Tune the decode-step GEMV (engine/kernels/gemv.py) against cuBLAS, on a GPU.

  PYTHONPATH=services/tts/src:. python -m bench.tune_gemv

For each projection of the 0.6B model (weight (N, K) in bf16) and M = 1, 2, 4 rows of x,
times F.linear and `kernels.linear` over a grid of (BLOCK_N, BLOCK_K, num_warps, STAGES);
each time is one CUDA graph of --calls back-to-back calls, replayed and divided; the calls
cycle through copies of the weight that together overflow L2, so that W comes from HBM as
in a decode step (~470 different weights). Prints a table (cuBLAS us, best us, best
config, GB/s of the weight read), the bf16 error of the best config and of cuBLAS against
a float32 product and against each other (max abs over the output's max abs), the time of
gemv's heuristic config, and a dict literal to paste into gemv.CONFIGS (None where ours
was not 2% faster than cuBLAS: `linear` then calls F.linear). The grid's kernels are
compiled first in parallel processes (Triton's disk cache); a run takes under 2 minutes.
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing as mp
import os
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F
import triton

# name -> (N, K, act): the 0.6B model's projections at hidden 1024 (0.6B talker layers
# and the code predictor's share these shapes).
SHAPES: dict[str, tuple[int, int, str | None]] = {
    "qkv": (4096, 1024, None),
    "o_proj": (1024, 2048, None),
    "gate_up": (6144, 1024, None),
    "down": (1024, 3072, None),
    "down+silu_mul": (1024, 3072, "silu_mul"),
    "cp_head": (2048, 1024, None),
    "talker_head": (3072, 1024, None),
}
L2_BYTES = 50 << 20  # H100: 50 MB


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def grid(k: int, block_ns=(1, 2, 4, 8), block_ks=(256, 512, 1024, 2048), warps=(2, 4, 8),
         stages=(1, 3, 4)) -> list[tuple[int, int, int, int]]:
    """Pruned configs: tiles of 1K-8K weights (fewer keep too little in flight, more
    spill registers), two 16-byte loads of W per thread and chunk at least, and no
    BLOCK_K over K. The defaults hold every winner of a full run (BLOCK_N to 16, stages
    1-4) on an H100, or one within 2% of it."""
    out = []
    for bn, bk, nw, st in itertools.product(block_ns, block_ks, warps, stages):
        tile = bn * bk
        if 1024 <= tile <= 8192 and tile >= nw * 32 * 16 and bk <= k:
            out.append((bn, bk, nw, st))
    return out


def inputs(n: int, k: int, m: int, act: str | None, copies: int = 1, seed: int = 0):
    """x (m, K or 2K) and `copies` weights (n, k), bf16, random (never zeros)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, 2 * k if act else k, device="cuda", generator=g).to(torch.bfloat16)
    ws = [(torch.randn(n, k, device="cuda", generator=g) / math.sqrt(k)).to(torch.bfloat16)
          for _ in range(copies)]
    return x, ws


def _compile(jobs: list[tuple[int, int, int, str | None, tuple[int, int, int, int]]]) -> int:
    """Run each job's kernel once (in a worker process): fills Triton's disk cache."""
    from voice_tts.engine.kernels import gemv

    for n, k, m, act, cfg in jobs:
        x, (w,) = inputs(n, k, m, act)
        gemv.linear(x, w, act, config=cfg)
    torch.cuda.synchronize()
    return len(jobs)


def precompile(cases, grid_of, procs: int) -> None:
    jobs = [(n, k, m, act, cfg) for n, k, m, act in cases for cfg in grid_of(k)]
    # One job per distinct kernel: N and K are not compile-time constants (only their
    # divisibility by 16 is, and every N and K here is a multiple of 16).
    uniq: dict[tuple, tuple] = {}
    for job in jobs:
        _, k, m, act, cfg = job
        uniq.setdefault((m, act, cfg, k % cfg[1] == 0), job)
    todo = list(uniq.values())
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(procs) as pool:
        done = sum(pool.map(_compile, [todo[i::procs] for i in range(procs)]))
    print(f"compiled {done} kernels in {time.perf_counter() - t0:.1f} s ({procs} processes)",
          flush=True)


def graph_us(fns: list, calls: int, rounds: int = 3, replays: int = 4) -> float:
    """Median time of one call (us): `calls` calls cycling over fns in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * calls))
    del graph
    return statistics.median(times)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " +
                   ", ".join(SHAPES))
    p.add_argument("--rows", default="1,2,4", help="M values, each <= gemv.MAX_ROWS")
    p.add_argument("--calls", type=int, default=200, help="calls per CUDA graph")
    p.add_argument("--block-n", type=ints, default=(1, 2, 4, 8))
    p.add_argument("--block-k", type=ints, default=(256, 512, 1024, 2048))
    p.add_argument("--warps", type=ints, default=(2, 4, 8))
    p.add_argument("--stages", type=ints, default=(1, 3, 4),
                   help="cp.async pipeline depth of the K loop (1: none)")
    p.add_argument("--top", type=int, default=0, help="also print the top configs of each")
    p.add_argument("--procs", type=int, default=min(16, os.cpu_count() or 1),
                   help="processes compiling the grid's kernels")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from voice_tts.engine.kernels import gemv, silu_mul

    rows = [int(r) for r in args.rows.split(",")]
    assert max(rows) <= gemv.MAX_ROWS, rows
    names = args.shapes.split(",")
    cases = [(*SHAPES[nm][:2], m, SHAPES[nm][2]) for nm in names for m in rows]
    t0 = time.perf_counter()
    def grid_of(k: int) -> list[tuple[int, int, int, int]]:
        return grid(k, args.block_n, args.block_k, args.warps, args.stages)

    precompile(cases, grid_of, args.procs)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; {args.calls} calls per graph")
    head = (f"{'shape':14} {'N':>5} {'K':>5} {'M':>2} {'cuBLAS us':>9} {'GB/s':>5} "
            f"{'best us':>8} {'GB/s':>5} {'speedup':>7} {'config (BN, BK, warps, st)':>26} "
            f"{'err ours':>9} {'err cuBLAS':>10} {'ours-cuBLAS':>9} {'heuristic us':>12}")
    print(head)
    best_cfgs: dict[tuple[int, int, int, str | None], tuple[int, int, int, int] | None] = {}
    for name in names:
        n, k, act = SHAPES[name]
        copies = max(2, math.ceil(2.5 * L2_BYTES / (n * k * 2)))
        for m in rows:
            x, ws = inputs(n, k, m, act, copies, seed=m)
            xa = silu_mul(x) if act else x  # cuBLAS gets the activation ready-made

            t_ref = graph_us([partial(F.linear, xa, w) for w in ws], args.calls)
            timed = {cfg: graph_us([partial(gemv.linear, x, w, act, config=cfg) for w in ws],
                                   args.calls) for cfg in grid_of(k)}
            cfg = min(timed, key=timed.get)
            if args.top:
                print("   ", ", ".join(f"{c}: {timed[c]:.2f}" for c in
                                      sorted(timed, key=timed.get)[:args.top]))
            # None (F.linear) unless ours is clearly faster than cuBLAS.
            best_cfgs[(n, k, m, act)] = cfg if timed[cfg] < 0.98 * t_ref else None
            heur = gemv._config(n, k, m, act)
            t_heur = timed.get(heur) or graph_us(
                [partial(gemv.linear, x, w, act, config=heur) for w in ws], args.calls)
            gb = (n * k + m * (x.shape[1] + n)) * 2 / 1e3  # bytes / 1e3 -> GB/s over us
            ref32 = F.linear(xa.float(), ws[0].float())
            y, y_ref = gemv.linear(x, ws[0], act, config=cfg), F.linear(xa, ws[0])
            err, err_ref = rel_err(y, ref32), rel_err(y_ref, ref32)
            diff = rel_err(y, y_ref.float())
            print(f"{name:14} {n:5} {k:5} {m:2} {t_ref:9.2f} {gb / t_ref:5.0f} "
                  f"{timed[cfg]:8.2f} {gb / timed[cfg]:5.0f} {t_ref / timed[cfg]:7.2f} "
                  f"{cfg!s:>26} {err:9.2e} {err_ref:10.2e} {diff:9.2e} {t_heur:12.2f}",
                  flush=True)
        torch.cuda.empty_cache()
    print(f"# tuned in {time.perf_counter() - t0:.0f} s")
    print("CONFIGS = {")
    for key, cfg in best_cfgs.items():
        print(f"    {key!r}: {cfg!r},")
    print("}")


if __name__ == "__main__":
    main()
