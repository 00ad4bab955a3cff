"""`python -m voice_agent`: the LiveKit worker, or `--direct` (no LiveKit).

    python -m voice_agent                         # worker (LIVEKIT_* env), framework CLI "start"
    python -m voice_agent --worker-args dev       # the framework's own CLI subcommands
    python -m voice_agent --direct --in user.wav [--in more.wav] --out reply.wav
    python -m voice_agent serve-direct            # no LiveKit: /metrics + /healthz only
    AGENT_PROCS=8 python -m voice_agent serve-direct   # 8 of them on one port (http.py)

Every setting is an env var (see settings.py / README); --direct prints the per-turn
metrics as JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from .settings import load_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m voice_agent",
        description="Voice agent: LiveKit worker (default) or a direct session on WAV files. "
        "Configured by env: AGENT_TTS_ADDR, AGENT_THINKER_ADDR, AGENT_HTTP_PORT, LIVEKIT_URL, "
        "LIVEKIT_API_KEY, LIVEKIT_API_SECRET, AGENT_* (see services/agent/README.md).",
    )
    p.add_argument("command", nargs="?", default="worker",
                   choices=["worker", "direct", "serve-direct"],
                   help="worker (default): LiveKit worker; direct: same as --direct; "
                   "serve-direct: no LiveKit, serve /metrics and /healthz until SIGTERM "
                   "(the local mesh; sessions run in-process via voice_agent.direct)")
    p.add_argument("--direct", action="store_true",
                   help="run one session on our own audio I/O instead of a LiveKit room")
    p.add_argument("--in", dest="inputs", action="append", default=[], metavar="WAV",
                   help="(direct) user speech, 16-bit PCM WAV; repeat for more turns")
    p.add_argument("--out", metavar="WAV", help="(direct) write the agent's side here")
    p.add_argument("--no-greeting", action="store_true", help="(direct) skip the greeting")
    p.add_argument("--turn-timeout", type=float, default=60.0,
                   help="(direct) seconds to wait for each reply (default 60)")
    p.add_argument("--worker-args", nargs=argparse.REMAINDER, default=[],
                   help="arguments for the framework's worker CLI (default: start)")
    p.add_argument("--reuse-port", action="store_true",
                   help="(serve-direct) share AGENT_HTTP_PORT with sibling processes "
                   "(SO_REUSEPORT); set by AGENT_PROCS's parent on its children")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    worker = not (args.direct or args.command in ("direct", "serve-direct"))
    if not worker:  # the framework's worker CLI sets up its own (JSON) logging
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = load_settings()
    if settings.tools:  # a bad AGENT_TOOLS fails the start, not the first call
        from .tools import load_tools

        try:
            names = [getattr(t, "id", "?") for t in load_tools(settings.tools)]
        except ValueError as e:
            raise SystemExit(f"voice-agent: {e}") from None
        logging.getLogger("voice_agent").info("tools: %s", ", ".join(names))
    if settings.turn_detection in ("audio", "fused"):  # a missing model fails the start
        from .conversation.turn_end import make_detector
        from .smart_turn import ModelMissing

        try:
            make_detector(settings)
        except ModelMissing as e:
            raise SystemExit(f"voice-agent: {e}") from None
    if settings.feedback_dir:  # a folder it cannot write fails the start, not a call
        from .feedback import FeedbackRecorder

        try:
            FeedbackRecorder(settings.feedback_dir, settings.feedback_max_mb)
        except ValueError as e:
            raise SystemExit(f"voice-agent: {e}") from None
    if args.command == "serve-direct" and settings.procs > 1:  # a parent, no agent itself
        from .http import serve_processes

        return serve_processes(settings)
    if worker and settings.procs > 1:
        logging.getLogger("voice_agent").warning(
            "AGENT_PROCS=%d is for serve-direct: the LiveKit worker is one process (LiveKit "
            "dispatch spreads rooms over workers by their load)", settings.procs)
    if not worker:  # the worker warms in its prewarm (worker._prewarm)
        from .warmup import warm_transcript_timing

        warm_transcript_timing()
    if args.command == "serve-direct":
        from .http import serve_forever

        asyncio.run(serve_forever(settings, reuse_port=args.reuse_port))
        return 0
    if worker:
        from .worker import run_worker

        run_worker(settings, args.worker_args)
        return 0
    if not args.inputs:
        raise SystemExit("--direct needs at least one --in WAV")
    from .direct import run_direct_session

    result = asyncio.run(run_direct_session(
        settings, user_wavs=args.inputs, out_wav=args.out, greet=not args.no_greeting,
        turn_timeout_s=args.turn_timeout))
    for turn in result.turns:
        print(json.dumps(turn, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
