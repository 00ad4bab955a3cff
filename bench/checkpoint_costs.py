"""What each TTS checkpoint costs a server: GPU memory and start-up to SERVING, alone and
several in one server (`TTS_MODEL=a,b,c`: one voice namespace).

Each row starts `python -m voice_tts.server` with that TTS_MODEL on the GPU (the server's
defaults otherwise: TTS_MAX_SESSIONS, TTS_MAX_SEQ_LEN, CUDA graphs), times it from spawn to
`/healthz` 200 (loaded and warmed up), then reads the process's GPU memory (nvidia-smi)
and the engine's own `tts_gpu_memory_bytes` (reserved, summed over its engines' device:
one number for the process). Random-weight presets at the real shapes: a real checkpoint
also reads its weights from disk (about 1.8 / 4.5 GB of safetensors for 0.6B / 1.7B).

  python -m bench.checkpoint_costs --out bench/out/checkpoint_costs.json
  python -m bench.checkpoint_costs --rows "preset:0.6b;preset:0.6b,preset:0.6b-base"
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROWS = ("preset:0.6b;preset:0.6b-base;preset:0.6b,preset:0.6b-base;preset:1.7b;"
        "preset:1.7b-base;preset:1.7b-design;preset:1.7b,preset:1.7b-base,preset:1.7b-design")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_mib(pid: int) -> float | None:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        p, mib = (x.strip() for x in line.split(","))
        if p == str(pid):
            return float(mib)
    return None


def reserved_bytes(metrics: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith('tts_gpu_memory_bytes{kind="reserved"}'):
            return float(line.split()[-1])
    return None


def row(models: str, timeout_s: float, env_extra: dict[str, str]) -> dict:
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "TTS_MODEL": models, "TTS_DEVICE": "cuda",
           "TTS_GRPC_HOST": "127.0.0.1", "TTS_GRPC_PORT": str(grpc_port),
           "TTS_HTTP_PORT": str(http_port), "TTS_LOG_LEVEL": "WARNING", **env_extra}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "voice_tts.server"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{http_port}"
    r: dict = {"models": models}
    try:
        while True:
            if proc.poll() is not None:
                r["error"] = f"exited {proc.returncode}: {(proc.stderr.read() or '')[-500:]}"
                return r
            if time.monotonic() - t0 > timeout_s:
                r["error"] = f"not serving after {timeout_s:.0f} s"
                return r
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1) as h:
                    if h.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        r["startup_s"] = round(time.monotonic() - t0, 1)
        time.sleep(1.0)  # the memory gauge is sampled every 0.5 s of steps / at start
        with urllib.request.urlopen(base + "/metrics", timeout=5) as m:
            res = reserved_bytes(m.read().decode())
        r["torch_reserved_gib"] = None if res is None else round(res / 2**30, 2)
        mib = gpu_mib(proc.pid)
        r["process_gpu_gib"] = None if mib is None else round(mib / 1024, 2)
        return r
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=ROWS, help="TTS_MODEL values, ';'-separated")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to SERVING, a row")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server")
    p.add_argument("--out", default="")
    a = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in a.env)
    rows = []
    print("| TTS_MODEL | start-up to SERVING s | process GPU GiB | torch reserved GiB |")
    print("|---|---|---|---|")
    for models in a.rows.split(";"):
        r = row(models, a.timeout, extra)
        rows.append(r)
        print(f"| {r['models']} | {r.get('startup_s', '-')} | {r.get('process_gpu_gib', '-')}"
              f" | {r.get('torch_reserved_gib', '-')} |" + (f" {r['error']}" if "error" in r
                                                            else ""), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"env": extra, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
