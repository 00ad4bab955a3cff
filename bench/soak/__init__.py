"""Open-loop soak of the TTS gRPC service (`python -m bench.soak`; cli.py says what it does).

Modules: plan (sentences, arrivals), client (the load: one call's stream and its actions),
grpc_fix (grpc.aio's status-masking write), checker (stream invariants, underruns), server
(start/stop, health, /metrics, log faults, nvidia-smi), run (the soak), report (summary,
percentiles, checks, headline), cli (options, main).
"""

from bench.soak.checker import TRUNCATED, Record, StreamChecker
from bench.soak.cli import main, parse_args
from bench.soak.plan import Plan, make_plans, pieces, sentence
from bench.soak.report import dist, headline, pct
from bench.soak.run import Soak
from bench.soak.server import Server

__all__ = ["TRUNCATED", "Plan", "Record", "Server", "Soak", "StreamChecker", "dist",
           "headline", "main", "make_plans", "parse_args", "pct", "pieces", "sentence"]
