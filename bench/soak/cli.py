"""Open-loop soak of the TTS gRPC service: Poisson arrivals through the real server, checked.

Requests arrive as a Poisson process at `--rate` req/s for `--duration` s (open loop: an
arrival never waits for earlier calls; design.md section 6). Each one opens a `Synthesize`
stream with a voice and language drawn from ListVoices, default sampling (EOS active) and
`sampling.max_frames` ~ the spoken length of its sentence (`--frames-per-char`, 0.9 codec
frames of 80 ms per character = ~14 characters per second), sends one English sentence of
20-220 characters whole (or, `--stream-text`, in small pieces at LLM speed), FLUSH, waits
for FLUSHED and half-closes. Shares of the calls STOP (`--stop-share`), RESET and speak a
new sentence (`--reset-share`) or drop the call (`--cancel-share`) at a random time after
their first audio.

Per call: dispatch -> SESSION_STARTED, dispatch -> first audio (client TTFA), end to end,
frames, status (OK, RESOURCE_EXHAUSTED with its latency, others), underruns (a player that
starts at an utterance's first frame plays frame k at k x frame_ms: frames that arrive
after that are late) and the stream's invariants (seq contiguous from 0, start_ms, frame
size, next_seq of events, nothing of a stopped utterance after STOPPED, FIRST_AUDIO before
an utterance's first frame, FLUSHED after its last): a violation fails the soak.

Every `--sample-every` s it logs progress and scrapes the server's /metrics (active
sessions, tts_gpu_memory_bytes) and, where there is one, nvidia-smi. At the end it checks:
no engine fault in the server log, the server alive and SERVING, tts_active_sessions back
to 0, GPU memory flat after warm-up, no broken stream, no error status, no hung call; prints
a JSON summary (also `--out`) and exits 1 if a check failed.

  # against a running server (HTTP side on its TTS_HTTP_PORT for /metrics):
  python -m bench.soak --addr 127.0.0.1:50051 --http-port 8001 --rate 20 --duration 60
  # start the server itself (its log and /metrics are read, it is stopped at the end):
  python -m bench.soak --start-server --model preset:0.6b --device cuda --max-sessions 256 \\
      --rate 100 --duration 240 --procs 4 --out soak.json --server-log soak_server.log
  # CPU, tiny random model:
  python -m bench.soak --start-server --rate 2 --duration 10 --max-sessions 8
  # the same load over the OpenAI HTTP front (or ws: the WebSocket; bench/soak/fronts.py):
  python -m bench.soak --start-server --protocol http --stop-share 0 --reset-share 0 \
      --cancel-share 0 --rate 2 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from bench.soak.report import headline
from bench.soak.run import Soak


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _server_args(p)
    _load_args(p)
    _client_args(p)
    _checks_and_output_args(p)
    a = p.parse_args(argv)
    _refuse_clashes(p, a)
    return a


def _server_args(p: argparse.ArgumentParser) -> None:
    """The server under load: a running one, or one started here."""
    g = p.add_argument_group("server")
    g.add_argument("--addr", default="127.0.0.1:50051",
                   help="gRPC address of a running server (ignored with --start-server)")
    g.add_argument("--http-port", type=int, default=None,
                   help="the server's TTS_HTTP_PORT for /metrics (running server: default "
                   "8001, 0 = no metrics; --start-server: a free port)")
    g.add_argument("--start-server", action="store_true",
                   help="start `python -m voice_tts.server` here, read its log, stop it")
    g.add_argument("--model", default=os.environ.get("TTS_MODEL", "preset:tiny"),
                   help="TTS_MODEL of the started server (default %(default)s)")
    g.add_argument("--device", default=os.environ.get("TTS_DEVICE", "cpu"),
                   help="TTS_DEVICE of the started server (default %(default)s)")
    g.add_argument("--max-sessions", type=int, default=64,
                   help="TTS_MAX_SESSIONS of the started server (default %(default)s)")
    g.add_argument("--grpc-port", type=int, default=0, help="started server: 0 = a free port")
    g.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra env of the started server (repeatable)")
    g.add_argument("--server-log", default=None,
                   help="started server: write its log here; running server: scan this "
                   "log for engine faults")
    g.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds for the server to report SERVING")


def _load_args(p: argparse.ArgumentParser) -> None:
    """The arrivals: rate, duration, texts, voices, what the calls do."""
    g = p.add_argument_group("load")
    g.add_argument("--protocol", choices=("grpc", "http", "ws"), default="grpc",
                   help="grpc: Synthesize streams; http: streamed POST /v1/audio/speech "
                   "(pcm; the text whole; no STOP/RESET/cancel); ws: the WebSocket "
                   "/v1/audio/speech/stream (no STOP/RESET/cancel here). http and ws need "
                   "the server's HTTP port (--http-port) and honour --frame-ms, "
                   "--sample-rate; --frames-per-message and --channels are gRPC's")
    g.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    g.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--frames-per-char", type=float, default=0.9,
                   help="sampling.max_frames = chars x this (0.9 x 80 ms = ~14 chars/s)")
    g.add_argument("--min-chars", type=int, default=20)
    g.add_argument("--max-chars", type=int, default=220)
    g.add_argument("--prompts", default="", metavar="FILE",
                   help="draw the sentences from this file (one per line; e.g. "
                   "bench/prompts/en_read_1088.txt) instead of generating them")
    g.add_argument("--voices", default="", help="comma list to restrict the voices drawn")
    g.add_argument("--stream-text", nargs="?", const="chars", choices=("chars", "words"),
                   help="send the text in pieces at LLM speed instead of whole: 1-6 "
                   "characters (chars, the default) or a word with the space or "
                   "punctuation after it (words)")
    g.add_argument("--piece-interval-ms", type=float, default=20.0,
                   help="--stream-text: time between pieces (20 ms = 50 tokens/s)")
    g.add_argument("--stop-share", type=float, default=0.1,
                   help="share of calls that STOP after their first audio")
    g.add_argument("--reset-share", type=float, default=0.1,
                   help="share of calls that RESET after their first audio and speak a "
                   "second sentence")
    g.add_argument("--cancel-share", type=float, default=0.1,
                   help="share of calls that the client drops after their first audio")
    g.add_argument("--frame-ms", type=int, default=20)
    g.add_argument("--frames-per-message", type=int, default=1,
                   help="SessionConfig.frames_per_message: frames an AudioFrame may hold")
    g.add_argument("--sample-rate", type=int, default=24000)


def _client_args(p: argparse.ArgumentParser) -> None:
    """The client processes, channels and timeouts."""
    g = p.add_argument_group("client")
    g.add_argument("--procs", type=int, default=1,
                   help="client processes (the load is split; use 2-4+ at 100+ req/s)")
    g.add_argument("--channels", type=int, default=2,
                   help="gRPC channels (TCP connections) per client process")
    g.add_argument("--no-grpc-write-fix", dest="grpc_write_fix", action="store_false",
                   help="do not patch grpc.aio's status-masking write (grpc/grpc#36066): "
                   "a call the server ends early may then read INTERNAL 'Internal error "
                   "from Core' instead of its status")
    g.add_argument("--deadline", type=float, default=None,
                   help="seconds for the whole run (server start-up included): the "
                   "arrivals are cut short so that drain, checks and summary fit in it")
    g.add_argument("--call-timeout", type=float, default=180.0,
                   help="a call open longer than this fails the soak")
    g.add_argument("--drain-timeout", type=float, default=120.0,
                   help="after the last arrival, seconds for open calls to end (then: hung)")


def _checks_and_output_args(p: argparse.ArgumentParser) -> None:
    """What fails the soak, and where its results go."""
    g = p.add_argument_group("checks and output")
    g.add_argument("--underrun-tolerance-ms", type=float, default=0.0,
                   help="a frame later than this behind the player counts as an underrun")
    g.add_argument("--warmup", type=float, default=None,
                   help="GPU memory baseline: first sample after this many seconds of load "
                   "(default 20%% of --duration, 2-30 s)")
    g.add_argument("--gpu-mem-growth-mb", type=float, default=64.0,
                   help="allowed GPU memory growth from after warm-up to the end")
    g.add_argument("--no-nvidia-smi", dest="nvidia_smi", action="store_false",
                   help="do not sample nvidia-smi")
    g.add_argument("--allow-error-logs", action="store_true",
                   help="server log lines at ERROR (other than the engine faults) do not "
                   "fail the soak (they are still counted)")
    g.add_argument("--settle-timeout", type=float, default=15.0,
                   help="seconds for tts_active_sessions to return to 0 after the calls")
    g.add_argument("--sample-every", type=float, default=5.0, help="progress/metrics period")
    g.add_argument("--client-lag-warn-ms", type=float, default=20.0,
                   help="p99 dispatch lateness or loop lag above this flags the client")
    g.add_argument("--gate-capacity", action="store_true",
                   help="also fail unless p95 TTFA <= 100 ms and zero underruns")
    g.add_argument("--out", default=None, help="write the JSON summary here too")
    g.add_argument("--records", default=None,
                   help="write every call's record here (JSON lines)")
    g.add_argument("--no-samples", action="store_true",
                   help="leave the periodic samples out of the printed summary (kept in --out)")


def _refuse_clashes(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """What the options may not be together (argparse's error, exit 2)."""
    if a.http_port is None:
        a.http_port = 0 if a.start_server else 8001
    if a.rate <= 0 or a.duration <= 0:
        p.error("--rate and --duration must be > 0")
    if not 1 <= a.min_chars <= a.max_chars:
        p.error("need 1 <= --min-chars <= --max-chars")
    if a.stop_share + a.reset_share + a.cancel_share > 1:
        p.error("--stop-share + --reset-share + --cancel-share must be <= 1")
    if a.protocol != "grpc":
        if a.stop_share or a.reset_share or a.cancel_share:
            p.error(f"--protocol {a.protocol}: STOP/RESET/cancel are gRPC's here; pass "
                    "--stop-share 0 --reset-share 0 --cancel-share 0")
        if a.protocol == "http" and a.stream_text:
            p.error("--protocol http takes the text whole: --stream-text is gRPC's and ws's")
        if not a.http_port and not a.start_server:  # a started server gets a free one
            p.error(f"--protocol {a.protocol} needs the server's HTTP port (--http-port)")


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        summary = asyncio.run(Soak(a).run())
    except Exception as e:  # no soak at all (the server did not start, say): say so in --out
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"pass": False, "failures": [
                f"soak did not run: {e!r}"[:2000]], "rate": a.rate}, indent=1) + "\n")
        print(f"soak FAILED: {e!r}"[:4000], file=sys.stderr, flush=True)
        sys.exit(2)
    text = json.dumps(summary, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    shown = {k: v for k, v in summary.items() if k != "samples"} if a.no_samples else summary
    print(json.dumps(shown, indent=1), flush=True)
    print("soak: " + headline(summary), file=sys.stderr, flush=True)
    print(f"soak {'PASSED' if summary['pass'] else 'FAILED'}"
          + ("" if summary["pass"] else ": " + "; ".join(summary["failures"])),
          file=sys.stderr, flush=True)
    sys.exit(0 if summary["pass"] else 1)

