"""The whole voice loop, measured: the agent's direct mode against a real thinker and TTS.

Each conversation is its own process (a LiveKit worker runs a job per process) running
the real agent pipeline (`voice_agent.direct.DirectSession`: Silero VAD, the STT,
the thinker and TTS plugins, the duplex controller, a real-time speaker) on spoken
WAVs (espeak-ng, made here with `make-wavs`, or carried with `--wavs`). A conversation
says `--turns` turns, each after the agent has gone quiet, then one turn it interrupts
while the agent speaks. Conversations start spread over `--spread` seconds, so their
turns' ends do not all fall together.

Reported per level of `--conversations`: end of turn -> first agent audio out (the
agent's own `eot_to_first_audio_ms`: the VAD's end of speech, back-dated by its silence
hangover, to the first frame the speaker plays), p50/p95/max, with the stages under it
(STT, thinker TTFT, TTS TTFA, client side), turns left unanswered, and barge-in: the
VAD's decision -> the speaker silent (`cancel_to_silence`).

  python -m bench.agent_loop make-wavs bench/out/loop_wavs          # espeak-ng here
  python -m bench.agent_loop --tts 127.0.0.1:50051 --thinker 127.0.0.1:50052 \\
      --wavs bench/out/loop_wavs --conversations 1,16 --out bench/out/loop.json

Needs the agent's packages (services/agent, e.g. `.venv/agent/bin/python`) and an STT
the thinker does not provide: `--stt pocketsphinx` (default: offline, CPU) for a
text-only thinker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.soak.report import dist

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = (
    "What is the weather like today?",
    "Can you tell me a short story about the sea?",
    "How far is it from here to the station?",
    "Please remind me to call my sister tomorrow.",
    "What time does the museum open on Sunday?",
)
INTERRUPT = "Wait, stop, stop please."


def make_wavs(out: Path) -> list[Path]:
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is missing (services/agent/setup.sh installs it)")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate((*SENTENCES, INTERRUPT)):
        p = out / (f"turn{i}.wav" if text != INTERRUPT else "interrupt.wav")
        subprocess.run(["espeak-ng", "-v", "en", "-w", str(p), text], check=True)
        paths.append(p)
    return paths


# -- one conversation (its own process) --------------------------------------------------------
async def conversation(args: argparse.Namespace) -> dict[str, Any]:
    from voice_agent.direct import DirectSession, read_wav_16k
    from voice_agent.duplex import DuplexState
    from voice_agent.settings import AgentSettings

    wavs = Path(args.wavs)
    turns = sorted(wavs.glob("turn*.wav"))
    interrupt = read_wav_16k(wavs / "interrupt.wav")
    settings = AgentSettings(
        tts_addr=args.tts, thinker_addr=args.thinker, http_port=0, greeting="",
        stt_backend=args.stt, stt_workers=1, llm_max_tokens=args.max_tokens,
        tts_max_frames=args.max_frames, llm_temperature=1.0, llm_seed=args.index,
        tts_text_filters=args.text_filters)
    out: dict[str, Any] = {"index": args.index, "unanswered": 0, "barge_in": None}
    async with DirectSession(settings, greet=False) as ds:
        await ds.wait_until_quiet(timeout=60, quiet_s=0.3)
        await asyncio.sleep(args.offset)
        for t in range(args.turns):
            clip = read_wav_16k(turns[(args.index + t) % len(turns)])
            if not await ds.user_turn(clip, timeout=args.turn_timeout, quiet_s=0.3):
                out["unanswered"] += 1
        # The barge-in turn: interrupt the reply half a second into its audio.
        await ds.say_user(read_wav_16k(turns[args.index % len(turns)]))
        try:
            await ds.wait_state(DuplexState.SPEAKING, timeout=args.turn_timeout)
            await asyncio.sleep(0.5)
            await ds.say_user(interrupt)
            async with asyncio.timeout(10):
                while not ds.duplex.barge_ins:
                    await asyncio.sleep(0.005)
            b = ds.duplex.barge_ins[0]
            out["barge_in"] = {"cancel_to_silence_ms": round(b.cancel_to_silence_s * 1e3, 2),
                               "state_before": b.state_before.name,
                               "llm_cancelled": b.llm_cancelled, "tts_stopped": b.tts_stopped}
        except TimeoutError:
            out["barge_in"] = {"missed": True}
        await ds.wait_until_quiet(timeout=args.turn_timeout, quiet_s=0.3)
        out["turns"] = [t for t in ds.result().turns if t.get("kind") == "user"]
    return out


# -- the levels ---------------------------------------------------------------------------------
async def level(args: argparse.Namespace, n: int) -> dict[str, Any]:
    rng = random.Random(n)
    procs = []
    for i in range(n):
        offset = rng.uniform(0.0, args.spread) if n > 1 else 0.0
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.agent_loop", "one", "--index", str(i),
            "--offset", f"{offset:.3f}", "--tts", args.tts, "--thinker", args.thinker,
            "--wavs", args.wavs, "--turns", str(args.turns), "--stt", args.stt,
            "--max-tokens", str(args.max_tokens), "--max-frames", str(args.max_frames),
            "--turn-timeout", str(args.turn_timeout),
            "--text-filters" if args.text_filters else "--no-text-filters", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE))
    convs, failed = [], []
    for i, p in enumerate(procs):
        stdout, stderr = await p.communicate()
        lines = stdout.decode().strip().splitlines()
        if p.returncode == 0 and lines:
            convs.append(json.loads(lines[-1]))
        else:
            failed.append({"index": i, "rc": p.returncode,
                           "stderr": stderr.decode(errors="replace")[-1500:]})
    turns = [t for c in convs for t in c["turns"]]

    def col(key: str) -> list[float]:
        return [float(t[key]) for t in turns if t.get(key) is not None]

    barge = [c["barge_in"] for c in convs if c.get("barge_in")]
    return {
        "conversations": n, "completed": len(convs), "failed": failed,
        "turns": len(turns), "unanswered": sum(c["unanswered"] for c in convs),
        "eot_to_first_audio_ms": dist(col("eot_to_first_audio_ms")),
        "stt_ms": dist(col("stt_ms")), "vad_to_stt_ms": dist(col("vad_to_stt_ms")),
        "stt_to_llm_ms": dist(col("stt_to_llm_ms")),
        "llm_ttft_ms": dist(col("llm_ttft_ms")),
        "llm_to_tts_ms": dist(col("llm_to_tts_ms")),
        "tts_ttfa_ms": dist(col("tts_ttfa_ms")),
        "cancel_to_silence_ms": dist([b["cancel_to_silence_ms"] for b in barge
                                         if "cancel_to_silence_ms" in b]),
        "barge_ins_missed": sum(1 for b in barge if b.get("missed")),
        "per_turn": turns,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="run", choices=["run", "one", "make-wavs"],
                   help="run (default): the levels; make-wavs DIR: the speech; "
                   "one: a single conversation (internal)")
    p.add_argument("dir", nargs="?", help="make-wavs: where to write them")
    p.add_argument("--tts", default="127.0.0.1:50051", help="TTS gRPC address")
    p.add_argument("--thinker", default="127.0.0.1:50052", help="thinker gRPC address")
    p.add_argument("--wavs", default="bench/out/loop_wavs",
                   help="turn*.wav and interrupt.wav (made here if missing)")
    p.add_argument("--conversations", default="1,16", help="levels, comma-separated")
    p.add_argument("--turns", type=int, default=3, help="answered turns per conversation "
                   "(then one barge-in turn)")
    p.add_argument("--spread", type=float, default=3.0,
                   help="conversations start uniformly over this many seconds")
    p.add_argument("--stt", default="offline", choices=["offline", "thinker"])
    p.add_argument("--max-tokens", type=int, default=32, help="reply tokens (the thinker)")
    p.add_argument("--max-frames", type=int, default=50,
                   help="reply audio cap, codec frames of 80 ms (AGENT_TTS_MAX_FRAMES)")
    p.add_argument("--text-filters", action=argparse.BooleanOptionalAction, default=False,
                   help="the framework's markdown/emoji filters (AGENT_TTS_TEXT_FILTERS); "
                   "off by default here: a random-weight thinker's text is not language, "
                   "and they hold it as possible markdown")
    p.add_argument("--turn-timeout", type=float, default=60.0)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--offset", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help="JSON results (all levels)")
    args = p.parse_args()
    if args.what == "make-wavs":
        for path in make_wavs(Path(args.dir or args.wavs)):
            print(path)
        return
    if args.what == "one":
        print(json.dumps(asyncio.run(conversation(args))))
        return
    if not (Path(args.wavs) / "interrupt.wav").exists():
        make_wavs(Path(args.wavs))
    results = []
    for n in (int(x) for x in args.conversations.split(",")):
        t0 = time.monotonic()
        r = asyncio.run(level(args, n))
        r["wall_s"] = round(time.monotonic() - t0, 1)
        results.append(r)
        e, c = r["eot_to_first_audio_ms"], r["cancel_to_silence_ms"]
        print(f"{n} conversations: {r['turns']} turns ({r['unanswered']} unanswered, "
              f"{len(r['failed'])} failed): end of turn -> first audio p50 {e['p50']} p95 "
              f"{e['p95']} max {e['max']} ms; p50s: stt {r['stt_ms']['p50']}, stt -> "
              f"thinker {r['stt_to_llm_ms']['p50']}, thinker ttft {r['llm_ttft_ms']['p50']},"
              f" thinker -> tts {r['llm_to_tts_ms']['p50']}, tts ttfa "
              f"{r['tts_ttfa_ms']['p50']} ms; "
              f"cancel -> silence p50 {c['p50']} max {c['max']} ms "
              f"({r['barge_ins_missed']} missed)", flush=True)
        for f in r["failed"][:2]:
            print(f"  conversation {f['index']} failed (rc {f['rc']}): {f['stderr'][-600:]}",
                  file=sys.stderr)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        agent_env = {k: v for k, v in os.environ.items() if k.startswith("AGENT_")}
        Path(args.out).write_text(json.dumps(
            {"args": vars(args), "agent_env": agent_env, "levels": results}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
