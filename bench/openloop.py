"""Open-loop benchmark through the real gRPC server, by the method the field publishes.

Nari's Qwen3-TTS benchmark (nari-labs/benchmarks): Poisson arrivals at a target rate,
read English sentences (Seed-TTS test-en), the whole text sent once with streamed audio
back, p95 time to first audio seen by the client over localhost, and zero playback
underruns as a hard gate. Here: for each rate of `--rates`, a warm-up (`--warmup` s of
arrivals, not counted), then `--duration` s of arrivals (>= 120 s for a reported row),
each call a `Synthesize` stream with a voice drawn from ListVoices, default sampling (EOS
active) and `sampling.max_frames` set to its sentence's spoken length (0.9 frames of
80 ms per character, ~14 characters/s), the sentence from `--prompts` sent whole + FLUSH
(or, `--stream-text`, in 1-6 character pieces every `--piece-interval-ms`, LLM speed;
`--stream-text words`: a word at a time, each with the space or punctuation after it).

The load is the soak's (bench/soak/) with no STOP/RESET/drop: its clients in `--procs`
processes (their CPU share is reported: the client must not be the bottleneck), its
stream checks and its player clock (an utterance starts playing at its first frame; frame
k is due k x 20 ms later; a later frame is an underrun, counted any / > 20 ms / > 100 ms).
Per rate: client TTFA p50/p95/p99, E2E, underruns, errors by status, rejections, peak in
flight, audio seconds per wall second. The sweep stops after a rate whose p95 TTFA is over
`--stop-above-ms` or that had errors. `--start-server` starts one server for the sweep.

`--protocol` (default grpc): http makes each call a streamed `POST /v1/audio/speech`
(response_format pcm, the same voice, language, seed and max_frames; TTFA = first audio
bytes; HTTP 429/503 are the rejections; the server sends it unpaced, gRPC and ws paced);
ws the WebSocket `/v1/audio/speech/stream` (config, text, flush, end; TTFA = first binary
frame; close 1013/1012 are the rejections); all runs the three in turn at each rate, the
same arrivals, a fresh warm-up each, a row per (rate, protocol) (bench/soak/fronts.py).

  python -m bench.openloop --start-server --model preset:1.7b --device cuda \\
      --max-sessions 256 --rates 1,10,20,40,60 --duration 120 --procs 4 --out ol.json
  python -m bench.openloop --rates 1,2 --duration 10 --warmup 2   # a running server
  python -m bench.openloop --start-server --protocol all --rates 1,10 --duration 60

Cloned voices (`--clone-voices N`, a Base checkpoint's server): before the sweep, N
library voices are made through gRPC `CreateVoice` from `--clone-seconds` of reference
audio made here (bench/clones.py: espeak-ng if installed, else a synthetic voice; with
its transcript for in-context clones, `--clone-mode icl`, or without, `xvec`), each
timed; each is then called twice at idle (first use vs cached use: client TTFA); every
call of the sweep draws its voice from those N (not ListVoices' presets); they are
deleted at the end. A started server gets a temporary `TTS_VOICE_DIR` unless
`--server-env` names one; a running server needs its own.

  python -m bench.openloop --start-server --model preset:1.7b-base --device cuda \
      --clone-voices 20 --clone-seconds 10 --max-sessions 256 --rates 1,10,20 --out cl.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.clones import ClonedVoices, voice_counts
from bench.soak.cli import parse_args as soak_args
from bench.soak.plan import read_prompts
from bench.soak.run import Soak
from bench.soak.server import Server

PROMPTS = Path(__file__).with_name("prompts") / "en_read_1088.txt"
PROTOCOLS = ("grpc", "http", "ws")  # --protocol all: this order at each rate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.openloop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1,10,20", help="arrival rates (req/s), comma list")
    p.add_argument("--protocol", choices=(*PROTOCOLS, "all"), default="grpc",
                   help="grpc (Synthesize), http (streamed POST /v1/audio/speech, pcm), ws "
                   "(the WebSocket /v1/audio/speech/stream), or all: the three in turn at "
                   "each rate. Every option applies to all three but --stream-text and "
                   "--piece-interval-ms (grpc, ws: HTTP takes the text whole) and "
                   "--frames-per-message (grpc: the WS front sends a frame per message, "
                   "HTTP a packet per write)")
    p.add_argument("--duration", type=float, default=120.0,
                   help="seconds of counted arrivals per rate (default %(default)s)")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds of arrivals before each rate's count (default %(default)s)")
    p.add_argument("--prompts", default=str(PROMPTS), help="one sentence per line")
    p.add_argument("--stream-text", nargs="?", const="chars", choices=("chars", "words"),
                   help="send each sentence in pieces at LLM speed, not whole: 1-6 "
                   "characters (chars, the default) or a word and what follows it (words)")
    p.add_argument("--piece-interval-ms", type=float, default=50.0,
                   help="--stream-text: ms between pieces (50 = 20 pieces/s)")
    p.add_argument("--procs", type=int, default=4, help="client processes")
    p.add_argument("--frames-per-message", type=int, default=1,
                   help="SessionConfig.frames_per_message (1: a message per 20 ms frame; "
                   "gRPC only)")
    p.add_argument("--stop-above-ms", type=float, default=500.0,
                   help="stop the sweep after a rate whose p95 TTFA is above this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON rows here")
    g = p.add_argument_group("cloned voices (a Base checkpoint's server)")
    g.add_argument("--clone-voices", type=int, default=0, metavar="N",
                   help="make N library voices before the sweep and draw every call's "
                   "voice from them (0: ListVoices' voices)")
    g.add_argument("--clone-seconds", type=float, default=10.0,
                   help="length of each reference (3-30 s; default %(default)s)")
    g.add_argument("--clone-mode", choices=("icl", "xvec"), default="icl",
                   help="icl: in-context (reference codes + transcript); xvec: the "
                   "x-vector alone")
    g.add_argument("--clone-audio", choices=("auto", "espeak", "synth"), default="auto",
                   help="reference audio: espeak-ng, a synthetic voice, or auto (espeak-ng "
                   "if installed)")
    g.add_argument("--clone-prefix", default="olclone", help="the voices' names' prefix")
    g.add_argument("--keep-voices", action="store_true", help="do not delete them at the end")
    g = p.add_argument_group("server (as bench.soak)")
    g.add_argument("--addr", default="127.0.0.1:50051")
    g.add_argument("--http-port", type=int, default=None)
    g.add_argument("--start-server", action="store_true")
    g.add_argument("--model", default="preset:tiny")
    g.add_argument("--device", default="cpu")
    g.add_argument("--max-sessions", type=int, default=64)
    g.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--server-log", default=None)
    a = p.parse_args(argv)
    try:
        a.rates = [float(x) for x in a.rates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--rates: not a comma list of numbers: {a.rates!r}")
    if not a.rates or min(a.rates) <= 0:
        p.error("--rates: give rates > 0")
    if a.clone_voices < 0 or (a.clone_voices and not 3 <= a.clone_seconds <= 30):
        p.error("--clone-voices >= 0, --clone-seconds 3-30")
    if a.stream_text and a.protocol in ("http", "all"):
        p.error(f"--protocol {a.protocol}: HTTP takes the text whole; --stream-text is for "
                "grpc and ws")
    a.protocols = list(PROTOCOLS) if a.protocol == "all" else [a.protocol]
    return a


def soak_argv(a: argparse.Namespace, server: Server, protocol: str, rate: float,
              duration: float, seed: int, voices: list[str] | None = None,
              records: Path | None = None) -> list[str]:
    """The soak's arguments for one run against the sweep's server."""
    argv = ["--protocol", protocol, "--addr", server.addr,
            "--http-port", str(server.http_port or 0),
            "--rate", f"{rate:g}", "--duration", f"{duration:g}", "--seed", str(seed),
            "--prompts", a.prompts, "--stop-share", "0", "--reset-share", "0",
            "--cancel-share", "0", "--procs", str(a.procs),
            "--frames-per-message", str(a.frames_per_message),
            "--piece-interval-ms", f"{a.piece_interval_ms:g}", "--no-samples",
            # admission sheds before it fails: a rejection is a row's number, not a fault
            "--allow-error-logs"]
    if a.stream_text:
        argv += ["--stream-text", a.stream_text]
    if server.log_path:
        argv += ["--server-log", str(server.log_path)]
    if voices:
        argv += ["--voices", ",".join(voices)]
    if records is not None:
        argv += ["--records", str(records)]
    return argv


def row(rate: float, protocol: str, s: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one rate and protocol, as the table reports them."""
    u, c = s["underruns"], s["counts"]
    return {
        "rate": rate, "protocol": protocol, "achieved_rate": s["achieved_rate"],
        "calls": s["arrivals"],
        "errors": c.get("error", 0) + c.get("timeout", 0) + c.get("hung", 0),
        "ttfa_ms": s["ttfa_ms"], "server_ttfa_ms": s["server_ttfa_ms"], "e2e_ms": s["e2e_ms"],
        # where the server's TTFA went: queue (text in -> its prompt runs: the step in
        # flight), prefill, first_packet (text in -> the engine's packet); the session's
        # start as the client saw it
        "server_parts_ms": s["server_parts_ms"], "session_started_ms": s["session_started_ms"],
        "underruns": {"late_frames": u["late_frames"],
                      "over_20ms": u["late_frames_over_20ms"],
                      "over_100ms": u["late_frames_over_100ms"],
                      "utterances": u["utterances_with_underrun"], "max_late_ms": u["max_late_ms"],
                      "frames": u["frames"]},
        "by_code": s["by_code"], "rejected": s["rejections"]["n"],
        "rejection_examples": s["rejections"]["examples"],
        # the server's counter: every run so far, by reason (capacity, front, sessions)
        "admission_rejected_total": s["server_metrics_end"]["admission_rejected"],
        "peak_inflight": s["peak_inflight"], "audio_s_per_wall_s": s["audio_s_per_wall_s"],
        "client_cpu_share": [p["cpu_share"] for p in s["client"]["procs"]],
        "client_lagging": s["client"]["lagging"],
        "server_step_ms_mean": s["server_metrics_end"]["step_ms_mean"],
        "server_batch_mean": s["server_metrics_end"]["batch_mean"],
        "pass": s["pass"], "failures": s["failures"],
    }


def line(r: dict[str, Any]) -> str:
    t, u = r["ttfa_ms"], r["underruns"]
    return (f"rate {r['rate']:g}/s {r['protocol']} ({r['calls']} calls): TTFA p50/p95/p99 "
            f"{t['p50']}/{t['p95']}/{t['p99']} ms; errors {r['errors']}; underruns "
            f"{u['late_frames']} frames (>20 ms {u['over_20ms']}, "
            f">100 ms {u['over_100ms']}) of {u['frames']}; codes {r['by_code']}; peak in "
            f"flight {r['peak_inflight']}; audio {r['audio_s_per_wall_s']} s/s; client CPU "
            f"{r['client_cpu_share']}{' LAGGING' if r['client_lagging'] else ''}")


async def sweep(a: argparse.Namespace) -> dict[str, Any]:
    server, voice_dir = _server(a)
    tmp = Path(tempfile.mkdtemp(prefix="openloop-"))  # the calls' records, per run
    rows: list[dict[str, Any]] = []
    # what was served, not what was asked for: the server's tts_server_info (model, device,
    # slots, front processes, log level ...), read with each row's metrics
    result = {"date": time.strftime("%Y-%m-%d"), "model": None,
              "model_asked": a.model if a.start_server else None, "served": None,
              "stream_text": a.stream_text,
              "piece_interval_ms": a.piece_interval_ms if a.stream_text else None,
              "protocols": a.protocols,
              "duration_s": a.duration, "warmup_s": a.warmup, "procs": a.procs,
              "frames_per_message": a.frames_per_message,
              "prompts": a.prompts, "server_env": a.server_env, "rows": rows}
    clones = None
    if a.start_server:
        server.start()
    try:
        await server.wait_serving(900)
        if a.clone_voices:
            clones = await _clone(a, server, result)
        names = clones.names if clones else None
        for i, rate in enumerate(a.rates):
            stop = await _rate(a, server, i, rate, names, tmp, result)
            if stop:  # the rate's other protocols still ran: its rows compare
                print(f"openloop: stopping after {rate:g}/s ({'; '.join(stop)})",
                      file=sys.stderr, flush=True)
                break
    finally:
        if clones is not None and not a.keep_voices and server.alive():
            try:
                await clones.delete()
            except Exception as e:  # the rows stand; say what is left on the server
                print(f"openloop: deleting the cloned voices failed: {e!r}", file=sys.stderr)
                result["clones"]["delete_error"] = repr(e)[:300]
        if a.start_server:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if voice_dir:
            shutil.rmtree(voice_dir, ignore_errors=True)
    return result


def _server(a: argparse.Namespace) -> tuple[Server, str | None]:
    """The server the sweep loads (started by it, or one already running), and the voice
    library folder made for it (cloned voices on a server it starts)."""
    base = ["--addr", a.addr, "--model", a.model, "--device", a.device,
            "--max-sessions", str(a.max_sessions)]
    voice_dir = None
    if (a.clone_voices and a.start_server
            and not any(kv.startswith("TTS_VOICE_DIR=") for kv in a.server_env)):
        voice_dir = tempfile.mkdtemp(prefix="openloop-voices-")
        a.server_env = [*a.server_env, f"TTS_VOICE_DIR={voice_dir}"]
    if a.http_port is not None:
        base += ["--http-port", str(a.http_port)]
    if a.start_server:
        base.append("--start-server")
    for kv in a.server_env:
        base += ["--server-env", kv]
    if a.server_log:
        base += ["--server-log", a.server_log]
    return Server(soak_args(base)), voice_dir


async def _clone(a: argparse.Namespace, server: Server,
                 result: dict[str, Any]) -> ClonedVoices:
    """The cloned voices the calls use, made and probed at idle (in `result`)."""
    clones = ClonedVoices(server.addr, a.clone_voices, a.clone_seconds, a.clone_mode,
                          a.clone_audio, read_prompts(a.prompts), a.clone_prefix)
    result["clones"] = clones.info
    await clones.create()
    await clones.probe()
    i = clones.info
    print(f"openloop: {a.clone_voices} cloned voices ({a.clone_mode}, "
          f"{a.clone_seconds:g} s {i['audio']} references): create median "
          f"{i['create_ms_median']} ms (max {i['create_ms_max']}); TTFA at idle, "
          f"first use {i['first_use_ttfa_ms_median']} ms, cached "
          f"{i['cached_use_ttfa_ms_median']} ms (medians)", file=sys.stderr, flush=True)
    write(a.out, result)
    return clones


async def _rate(a: argparse.Namespace, server: Server, i: int, rate: float,
                names: list[str] | None, tmp: Path, result: dict[str, Any]) -> list[str]:
    """One rate, a row per protocol (the same arrivals, seed, for each); returns why the
    sweep stops here (a protocol over --stop-above-ms or failing), or nothing."""
    rows, stop = result["rows"], []
    for protocol in a.protocols:
        if a.warmup > 0:
            warm = soak_args(soak_argv(a, server, protocol, rate, a.warmup,
                                       a.seed + 1000 + i, names))
            await Soak(warm).run()
        recs = tmp / f"rate{i}-{protocol}.jsonl"
        s = await Soak(soak_args(soak_argv(a, server, protocol, rate, a.duration,
                                           a.seed + i, names, recs))).run()
        rows.append(row(rate, protocol, s))
        result["model"] = result["model"] or s["server"]["model"]  # the server's own
        result["served"] = result["served"] or s["server"]["info"]
        rows[-1]["voices_used"] = voice_counts(
            [json.loads(x) for x in recs.read_text().splitlines()] if recs.exists() else [])
        write(a.out, result)  # after each row: a sweep cut short keeps its rows
        print("openloop: " + line(rows[-1]), file=sys.stderr, flush=True)
        p95 = rows[-1]["ttfa_ms"]["p95"]
        if p95 is None or p95 > a.stop_above_ms or not s["pass"]:
            stop.append(f"{protocol} p95 {p95} ms, pass {s['pass']}")
    return stop


def table(rows: list[dict[str, Any]]) -> str:
    """The rows side by side: one line per (rate, protocol)."""
    out = [f"{'rate':>6} {'protocol':<8} {'calls':>6} {'TTFA p50':>9} {'p95':>8} {'p99':>8} "
           f"{'late':>6} {'>100ms':>6} {'rejected':>8} {'errors':>6}"]
    for r in rows:
        t, u = r["ttfa_ms"], r["underruns"]
        out.append(f"{r['rate']:>6g} {r['protocol']:<8} {r['calls']:>6} {t['p50']!s:>9} "
                   f"{t['p95']!s:>8} {t['p99']!s:>8} {u['late_frames']:>6} "
                   f"{u['over_100ms']:>6} {r['rejected']:>8} {r['errors']:>6}")
    return "\n".join(out)


def write(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    result = asyncio.run(sweep(a))
    write(a.out, result)
    print(json.dumps(result, indent=1), flush=True)
    print(table(result["rows"]), file=sys.stderr, flush=True)
    sys.exit(0 if result["rows"] and all(r["pass"] for r in result["rows"]) else 1)


if __name__ == "__main__":
    main()
