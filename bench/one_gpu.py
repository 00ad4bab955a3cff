"""The thinker and the TTS on one GPU, the real servers, measured alone and together.

For each `--modes` entry this starts, on the one GPU, the TTS server (`--tts-model`, e.g.
preset:0.6b) and the thinker (Transformers backend, `--llm-model`, e.g.
random:qwen3-1.7b: that shape, random weights), each with its mode's environment, then
runs three phases against them:

- `tts_alone`: the open-loop TTS bench (bench/openloop.py: Poisson arrivals at `--rate`,
  EOS active, client TTFA and underruns) while the thinker idles;
- `llm_alone`: `--chats` conversations with long histories (bench/thinker_load.py: TTFT,
  tokens/s) while the TTS idles;
- `together`: both loads at once;
- `loop` (with `--loop 1,16`): the whole voice loop, the agent's direct mode in a process
  per conversation against the two servers (bench/agent_loop.py: end of turn -> first
  audio, its stages, cancel -> silence on barge-in) at each level.
- `conv` (with `--conv 1,16,64`): conversations per GPU as users load it: `--agents`
  `serve-direct` agent processes (the `/v1/talk` WebSocket, `--agent-env` settings) and
  the conversation load generator (bench/conversations.py) against them at each level,
  the host's CPU per process sampled meanwhile (bench/host_load.py).
- `rvt` (with `--rvt 10`): end of turn -> first audio over the agent's two doors, one
  `serve-direct` agent (no greeting) and bench/realtime_vs_talk.py, `--rvt` turns a door.

`--phases` picks among them (default: the first three, and `loop` when `--loop` is given).

Modes (`--modes`): `timeslice` (no MPS: CUDA time-slices the two processes),
`mps-nocap` (one MPS daemon, nothing else), `mps-cap` (MPS, the SM caps compose carried
before: TTS 50 %, thinker 70 %), `mps-prio` (compose's gpu profile as .env.example sets
it: MPS client priorities, the TTS normal and the thinker below normal, so the TTS's
kernels go first when both are ready; its caps, 100 = none), `mps-prio-cap` (priorities
and the former caps). The MPS daemon runs with its pipe and log directories in a temp
dir and is stopped after its mode.

  python -m bench.one_gpu --modes timeslice,mps-nocap,mps-prio --chats 4 --out bench/out/one_gpu
One JSON per mode and phase under --out, and a table (markdown) on stdout and in
--out/table.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TTS_ADDR, TTS_HTTP, LLM_ADDR = "127.0.0.1:50051", 8001, "127.0.0.1:50052"


def env_file_shares() -> dict[str, str]:
    """The MPS settings compose's gpu profile uses (.env.example's TTS_/LLM_MPS_* lines)."""
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.startswith(("TTS_MPS_", "LLM_MPS_")):
            out[key] = value.strip()
    return out


# The SM caps compose carried before these measurements (TTS 50 %, thinker 70 %).
FORMER_CAPS = {"TTS": "50", "LLM": "70"}


def mode_env(mode: str, who: str, shares: dict[str, str]) -> dict[str, str]:
    """CUDA's environment for `who` (TTS or LLM) in `mode`: `mps-prio` is compose's gpu
    profile (its priorities and caps, from .env.example), the others vary one thing."""
    env: dict[str, str] = {}
    if mode in ("mps-cap", "mps-prio-cap"):
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = FORMER_CAPS[who]
    if mode == "mps-prio":
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = shares[f"{who}_MPS_ACTIVE_THREAD_PERCENTAGE"]
    if mode.startswith("mps-prio"):  # 0 normal, 1 below normal: the thinker yields to the TTS
        env["CUDA_MPS_CLIENT_PRIORITY"] = shares[f"{who}_MPS_CLIENT_PRIORITY"]
    return env


class MPS:
    """An MPS control daemon with its own pipe and log dirs (none for `timeslice`)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.dir = Path(tempfile.mkdtemp(prefix="mps-"))
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.dir / "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": str(self.dir / "log")} if on else {}

    def __enter__(self) -> MPS:
        if self.on:
            for d in self.env.values():
                os.makedirs(d, exist_ok=True)
            subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **self.env},
                           check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on:
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n",
                           env={**os.environ, **self.env}, check=False)
            time.sleep(1)
            log = self.dir / "log" / "control.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-5:]
                print("mps control.log:", *tail, sep="\n  ", file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, cwd=ROOT)


def wait_log(proc: subprocess.Popen, log: Path, marker: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(1)
    raise TimeoutError(f"{log.name}: no {marker!r} in {timeout:g} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tts_load(args: argparse.Namespace, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.openloop", "--addr", TTS_ADDR, "--http-port",
         str(TTS_HTTP), "--rates", str(args.rate), "--duration", str(args.seconds),
         "--warmup", str(args.warmup), "--procs", str(args.procs), "--out", str(out),
         "--model", args.tts_model, "--device", args.device],  # for the record only
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(out.with_suffix(".log")).open("w"))


def llm_load(args: argparse.Namespace, out: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.thinker_load", "--addr", LLM_ADDR, "--concurrency",
         str(args.chats), "--duration", str(seconds), "--prompt-words",
         str(args.prompt_words), "--max-tokens", str(args.max_tokens), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(out.with_suffix(".log")).open("w"))


@contextlib.contextmanager
def gpu_busy(out: Path, res: dict, phase: str):
    """Samples nvidia-smi's GPU utilization during a phase: how loaded the GPU was."""
    if not shutil.which("nvidia-smi"):
        yield
        return
    path = out / f"{phase}_util.csv"
    with path.open("w") as f:
        p = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu",
                              "--format=csv,noheader,nounits", "-lms", "250"], stdout=f)
        try:
            yield
        finally:
            p.terminate()
            p.wait()
    vals = [float(v) for v in path.read_text().split() if v.replace(".", "").isdigit()]
    res[f"{phase}_gpu_util_pct"] = round(sum(vals) / len(vals), 1) if vals else None


def loop_load(args: argparse.Namespace, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.agent_loop", "--tts", TTS_ADDR, "--thinker", LLM_ADDR,
         "--wavs", args.loop_wavs, "--conversations", args.loop, "--out", str(out)],
        cwd=ROOT, stderr=(out.with_suffix(".log")).open("w"))


AGENT_PORT0 = 8100


def agent_env(args: argparse.Namespace, sessions: int) -> dict[str, str]:
    """A serve-direct agent's settings against the two servers (conv, rvt)."""
    return {"AGENT_TTS_ADDR": TTS_ADDR, "AGENT_THINKER_ADDR": LLM_ADDR,
            "AGENT_WS_MAX_SESSIONS": str(sessions), "AGENT_HTTP_HOST": "127.0.0.1",
            # a random thinker hears nothing: the offline ear; its text is no markdown
            "AGENT_STT_BACKEND": "offline", "AGENT_TTS_TEXT_FILTERS": "false",
            "AGENT_LLM_MAX_TOKENS": "32", "AGENT_LLM_TEMPERATURE": "1.0",
            **dict(kv.split("=", 1) for kv in args.agent_env)}


def rvt_load(args: argparse.Namespace, out: Path) -> None:
    """One serve-direct agent (no greeting), then bench.realtime_vs_talk against it: end
    of turn -> first audio over /v1/talk and /v1/realtime, `--rvt` turns a door."""
    env = {**agent_env(args, 4), "AGENT_GREETING": "",
           "AGENT_HTTP_PORT": str(AGENT_PORT0)}
    agent = start([sys.executable, "-m", "voice_agent", "serve-direct"], env,
                  out / "rvt_agent.log")
    try:
        wait_http(agent, f"http://127.0.0.1:{AGENT_PORT0}/healthz", 300)
        print("rvt: agent up", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "bench.realtime_vs_talk",
                        "--agent", f"127.0.0.1:{AGENT_PORT0}", "--turns", str(args.rvt),
                        "--label", f"one_gpu {args.tts_model} + {args.llm_model}",
                        "--out", str(out / "rvt.json"), *args.rvt_args.split()], cwd=ROOT,
                       stderr=(out / "rvt.log").open("w"), check=False)
    finally:
        stop(agent)


def conv_load(args: argparse.Namespace, out: Path) -> None:
    """`--agents` serve-direct processes, then bench.conversations at each `--conv` level."""
    levels = conv_levels(args)
    per_agent = -(-max(levels) // args.agents)
    env = agent_env(args, per_agent)
    agents = [start([sys.executable, "-m", "voice_agent", "serve-direct"],
                    {**env, "AGENT_HTTP_PORT": str(AGENT_PORT0 + i)}, out / f"agent_{i}.log")
              for i in range(args.agents)]
    try:
        for i, a in enumerate(agents):
            wait_http(a, f"http://127.0.0.1:{AGENT_PORT0 + i}/healthz", 300)
        print(f"{len(agents)} agents up ({per_agent} conversations each)", file=sys.stderr,
              flush=True)
        addrs = [f"ws://127.0.0.1:{AGENT_PORT0 + i}/v1/talk" for i in range(args.agents)]
        rows = []
        for n in levels:  # low to high: a level never inherits an overloaded one's calls
            sampler = subprocess.Popen([sys.executable, "-m", "bench.host_load", "--out",
                                        str(out / f"host_load_{n}.json")], cwd=ROOT)
            try:
                subprocess.run([sys.executable, "-m", "bench.conversations",
                                *(x for a in addrs for x in ("--addr", a)),
                                "--conversations", str(n), "--out", str(out / f"conv_{n}.json"),
                                *args.conv_args.split()], cwd=ROOT,
                               stderr=(out / f"conv_{n}.log").open("w"), check=False)
            finally:
                sampler.terminate()
                sampler.wait()
            row = {"conversations": n}
            for name in ("conv", "host_load"):
                with contextlib.suppress(OSError, ValueError):
                    row[name] = json.loads((out / f"{name}_{n}.json").read_text())
            rows.append(row)
            print(f"conv {n}: done", file=sys.stderr, flush=True)
        (out / "conv.json").write_text(json.dumps(rows, indent=1))
    finally:
        for a in agents:
            stop(a)


def wait_http(proc: subprocess.Popen, url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited {proc.returncode}")
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"{url}: not 200 in {timeout:g} s")


def run_mode(mode: str, args: argparse.Namespace, shares: dict[str, str]) -> dict:
    out = Path(args.out) / mode
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"mode": mode}
    with MPS(mode.startswith("mps")) as mps:
        tts_env = {**mps.env, **mode_env(mode, "TTS", shares), "TTS_MODEL": args.tts_model,
                   "TTS_DEVICE": args.device, "TTS_MAX_SESSIONS": str(args.tts_sessions),
                   "TTS_HTTP_PORT": str(TTS_HTTP), "TTS_GRPC_HOST": "127.0.0.1"}
        llm_env = {**mps.env, **mode_env(mode, "LLM", shares), "LLM_BACKEND": "transformers",
                   "LLM_MODEL": args.llm_model, "LLM_DEVICE": args.device,
                   "LLM_MAX_CONCURRENT": str(max([args.chats, *loop_levels(args),
                                                     *conv_levels(args)])),
                   "LLM_MAX_MODEL_LEN": "4096",
                   "LLM_GRPC_HOST": "127.0.0.1", "LLM_HTTP_PORT": "8002",
                   **dict(kv.split("=", 1) for kv in args.llm_env)}
        res["env"] = {"tts": {k: v for k, v in tts_env.items() if k.startswith("CUDA")},
                      "llm": {k: v for k, v in llm_env.items()
                              if k.startswith(("CUDA", "LLM_PACE"))}}
        tts = start([sys.executable, "-m", "voice_tts.server"], tts_env, out / "tts.log")
        llm = start([sys.executable, "-m", "voice_llm.server"], llm_env, out / "llm.log")
        try:
            wait_log(llm, out / "llm.log", "thinker serving", 300)
            wait_log(tts, out / "tts.log", "TTS serving", 300)
            print(f"[{mode}] servers up", file=sys.stderr, flush=True)
            if "tts" in args.phases:
                with gpu_busy(out, res, "tts_alone"):
                    tts_load(args, out / "tts_alone.json").wait()
            if "llm" in args.phases:
                with gpu_busy(out, res, "llm_alone"):
                    llm_load(args, out / "llm_alone.json", args.seconds).wait()
            if "together" in args.phases:
                with gpu_busy(out, res, "together"):
                    llm_p = llm_load(args, out / "llm_together.json",
                                     args.seconds + args.warmup + 5)
                    time.sleep(3)
                    tts_load(args, out / "tts_together.json").wait()
                    llm_p.wait()
            if "loop" in args.phases:
                with gpu_busy(out, res, "loop"):
                    loop_load(args, out / "loop.json").wait()
            if "conv" in args.phases:
                with gpu_busy(out, res, "conv"):
                    conv_load(args, out)
            if "rvt" in args.phases:
                with gpu_busy(out, res, "rvt"):
                    rvt_load(args, out)
        finally:
            stop(tts)
            stop(llm)
    for phase in ("tts_alone", "llm_alone", "tts_together", "llm_together", "loop", "conv",
                  "rvt"):
        with contextlib.suppress(OSError, ValueError):
            res[phase] = json.loads((out / f"{phase}.json").read_text())
    return res


def tts_row(r: dict | None) -> tuple[str, str, str]:
    row = (r or {}).get("rows", [{}])[0] if r else {}
    ttfa = row.get("ttfa_ms", {})
    u = row.get("underruns", {})
    return (f"{ttfa.get('p95', '-')} ({ttfa.get('p50', '-')})",
            f"{u.get('late_frames', '-')} / {u.get('over_20ms', '-')}",
            f"{row.get('calls', '-')} / {row.get('rejected', '-')}")


def llm_row(r: dict | None) -> tuple[str, str]:
    r = r or {}
    return (f"{r.get('ttft_ms_p50', '-')} / {r.get('ttft_ms_p95', '-')}",
            f"{r.get('tokens_per_s', '-')} ({r.get('decode_tok_s_per_request_p50', '-')})")


def loop_levels(args: argparse.Namespace) -> list[int]:
    return [int(x) for x in args.loop.split(",")] if args.loop else []


def conv_levels(args: argparse.Namespace) -> list[int]:
    return [int(x) for x in args.conv.split(",")] if args.conv else []


def loop_table(results: list[dict]) -> str:
    lines = ["| mode | conversations | turns (unanswered) | end of turn -> first audio p50 / "
             "p95 / max ms | STT p50 ms | thinker TTFT p50 / p95 ms | TTS TTFA p50 / p95 ms | "
             "cancel -> silence p50 / max ms (missed) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for lv in (r.get("loop") or {}).get("levels", []):
            e, t, a, c = (lv[k] for k in ("eot_to_first_audio_ms", "llm_ttft_ms",
                                          "tts_ttfa_ms", "cancel_to_silence_ms"))
            lines.append(f"| {r['mode']} | {lv['conversations']} | {lv['turns']} "
                         f"({lv['unanswered']}) | {e['p50']} / {e['p95']} / {e['max']} | "
                         f"{lv['stt_ms']['p50']} | {t['p50']} / {t['p95']} | {a['p50']} / "
                         f"{a['p95']} | {c['p50']} / {c['max']} ({lv['barge_ins_missed']}) |")
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    lines = ["| mode | load | TTS TTFA p95 (p50) ms | underruns (any / > 20 ms) | TTS calls / "
             "rejected | thinker TTFT p50 / p95 ms | thinker tok/s (per request) | GPU busy "
             "% (TTS alone / thinker alone / together) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        util = " / ".join(str(r.get(f"{p}_gpu_util_pct", "-"))
                          for p in ("tts_alone", "llm_alone", "together"))
        lines.append(f"| {r['mode']} | alone | {' | '.join(tts_row(r.get('tts_alone')))} | "
                     f"{' | '.join(llm_row(r.get('llm_alone')))} | {util} |")
        lines.append(f"| {r['mode']} | together | "
                     f"{' | '.join(tts_row(r.get('tts_together')))} | "
                     f"{' | '.join(llm_row(r.get('llm_together')))} | |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="timeslice,mps-nocap,mps-prio")
    p.add_argument("--tts-model", default="preset:0.6b")
    p.add_argument("--llm-model", default="random:qwen3-1.7b")
    p.add_argument("--tts-sessions", type=int, default=256,
                   help="TTS_MAX_SESSIONS (its KV cache and graphs: ~65 GB at 256)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    p.add_argument("--rate", type=float, default=10.0, help="TTS arrivals per second")
    p.add_argument("--seconds", type=float, default=30.0, help="counted seconds per phase")
    p.add_argument("--warmup", type=float, default=5.0, help="TTS warm-up arrivals, s")
    p.add_argument("--procs", type=int, default=4, help="open-loop client processes")
    p.add_argument("--chats", type=int, default=4, help="concurrent thinker conversations")
    p.add_argument("--prompt-words", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--phases", default="", help="tts,llm,together,loop (default: the "
                   "first three, and loop when --loop is given)")
    p.add_argument("--loop", default="", help="agent loop levels (conversations), e.g. 1,16")
    p.add_argument("--loop-wavs", default="bench/out/loop_wavs",
                   help="the loop's speech (bench.agent_loop make-wavs)")
    p.add_argument("--conv", default="", help="conversation levels through /v1/talk, e.g. "
                   "1,16,64 (bench/conversations.py against --agents serve-direct agents)")
    p.add_argument("--agents", type=int, default=8, help="serve-direct agent processes")
    p.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE",
                   help="agent settings, e.g. AGENT_STT_OFFLINE_MODEL=pocketsphinx")
    p.add_argument("--conv-args", default="", help="more bench.conversations arguments")
    p.add_argument("--rvt", type=int, default=0, help="turns a door of end of turn -> first "
                   "audio over /v1/talk vs /v1/realtime (bench/realtime_vs_talk.py, one agent)")
    p.add_argument("--rvt-args", default="", help="more bench.realtime_vs_talk arguments")
    p.add_argument("--share", action="append", default=[], metavar="KEY=VALUE",
                   help="override a .env.example MPS line, e.g. "
                   "LLM_MPS_ACTIVE_THREAD_PERCENTAGE=40 (to try a setting before compose)")
    p.add_argument("--llm-env", action="append", default=[], metavar="KEY=VALUE",
                   help="more thinker environment, e.g. LLM_PACE_TOKENS_PER_S=20")
    p.add_argument("--out", default="bench/out/one_gpu")
    args = p.parse_args()
    args.phases = args.phases or ("tts,llm,together" + (",loop" if args.loop else "")
                                  + (",conv" if args.conv else "")
                                  + (",rvt" if args.rvt else ""))
    shares = env_file_shares() | dict(kv.split("=", 1) for kv in args.share)
    results = []
    for mode in args.modes.split(","):
        t0 = time.monotonic()
        results.append(run_mode(mode, args, shares))
        print(f"[{mode}] done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        Path(args.out, "results.json").write_text(json.dumps(results, indent=1))
    text = table(results) + ("\n\n" + loop_table(results) if args.loop else "")
    Path(args.out, "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
