"""One GPU client of the MPS contention check (contention.sh runs several at once).

Roles, each a proxy, not the real services:
  small  a TTS-like decode step: 28 chained (64x1024)@(1024x1024) bf16 matmuls, then a
         sync; prints the step latency P50/P99 over the window.
  big    a thinker-prefill-like load: 8192^3 bf16 matmuls back to back; prints TFLOP/s.
  limits what CUDA reports and allows under the client's MPS caps: SM count, free
         memory, and whether 8 GiB / 12 GiB allocations succeed.
Prints one JSON line. Needs torch with CUDA.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def try_alloc(gib: float) -> bool:
    try:
        x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()
        return True
    except torch.OutOfMemoryError:
        return False


def small(seconds: float) -> dict:
    a = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    for _ in range(50):
        (a @ w).relu_()
    torch.cuda.synchronize()
    lat = []
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        y = a
        for _ in range(28):
            y = (y @ w).relu_()
        torch.cuda.synchronize()
        lat.append(time.perf_counter() - t0)
    lat.sort()
    n = len(lat)
    return {"steps": n, "p50_ms": round(lat[n // 2] * 1e3, 3),
            "p99_ms": round(lat[int(n * 0.99)] * 1e3, 3)}


def big(seconds: float) -> dict:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end, k = time.time() + seconds, 0
    while time.time() < end:
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
        k += 4
    return {"tflops": round(k * 2 * 8192**3 / seconds / 1e12, 1)}


def main() -> int:
    role, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    out = {
        "role": role,
        "uid": os.getuid(),
        "active_thread_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "pinned_mem_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "sm": torch.cuda.get_device_properties(0).multi_processor_count,
        "free_gib": round(free / 2**30, 1),
        "total_gib": round(total / 2**30, 1),
    }
    if role == "small":
        out |= small(seconds)
    elif role == "big":
        out |= big(seconds)
    elif role == "limits":
        out |= {"alloc_8g": try_alloc(8), "alloc_12g": try_alloc(12)}
    else:
        print(f"unknown role {role!r}: small, big or limits", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
