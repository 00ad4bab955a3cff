#!/usr/bin/env python3
"""Runs the test suites, each in its own virtualenv, in parallel lanes, with a time budget.

    python3 .ci/suites.py                 # every suite below
    python3 .ci/suites.py tts agent       # some of them
    python3 .ci/suites.py --table         # the table of the last run (.run/ci/times.json)

A suite over its budget fails CI even when its tests pass: the whole `.ci/run` must stay
within its 35 minutes on a 2-core machine, and a suite that grows is seen the day it grows.
A suite's set-up (a venv or images built, first on a new machine, then mostly cached) is
timed apart, against a budget of its own: a cold machine's installs do not fail a suite
whose tests kept their time. Each suite's log is .run/ci/<name>.log; the table lists each
suite's set-up and test times, their budgets and its slowest tests (pytest's junit XML).

Lanes: CI_LANES lanes (default 2, one per core) take the suites from one queue, longest
expected first (`expect_s`, the wall time of the last fresh-clone run), each lane the next
one when its last ends: the lanes end within a short suite of each other. Most suites
wait on clocks (real-time audio, servers starting) more than they compute, so two lanes
finish in about half the time of one. VOICE_REQUIRE_ORACLE=1: the TTS engine is
proved against the official code, never silently skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".run" / "ci"
VLLM_VENV = os.environ.get("VLLM_VENV", str(Path.home() / ".cache/voice-stack/venv-vllm"))


@dataclass
class Suite:
    name: str
    python: str  # the venv's interpreter, relative to the root unless absolute
    paths: list[str]
    budget_s: int  # the tests' wall time on the 2-core CI machine, two lanes busy
    expect_s: int  # what it took in the last fresh-clone `.ci/run`: the queue's order
    args: list[str] = field(default_factory=list)
    setup: list[str] | None = None  # a command run first (installs, builds), timed apart
    setup_budget_s: int = 0  # the set-up's budget, on a machine with nothing cached
    command: list[str] | None = None  # instead of pytest (e.g. `make test-compose`)


# Budgets: about 1.5x what the suite took in a fresh-clone `.ci/run` with two lanes busy;
# `expect_s`: that time (2026-11-27), which orders the queue.
SUITES = [
    # The TTS's two halves run as two suites, so that the lanes can balance (21 min whole).
    Suite("tts-engine", ".venv/tts/bin/python", ["services/tts/tests/engine"], 900, 740),
    Suite("tts-server", ".venv/tts/bin/python", ["services/tts/tests/server"], 950, 650),
    Suite("agent", ".venv/agent/bin/python", ["services/agent/tests"], 1100, 780),
    Suite("autortc", ".venv/autortc/bin/python", ["services/autortc/tests"], 600, 415),
    Suite("llm", ".venv/llm/bin/python", ["services/llm/tests"], 150, 95),
    # Set-up: the vLLM venv, ~4.5 min on a new machine (41 s when cached).
    Suite("vllm", f"{VLLM_VENV}/bin/python", ["services/llm/tests"], 300, 140, ["-m", "vllm"],
          setup=["bash", "services/llm/vllm_venv.sh"], setup_budget_s=600),
    Suite("token", ".venv/token/bin/python", ["services/token/tests"], 150, 65),
    Suite("bench", ".venv/tts/bin/python", ["bench/tests"], 360, 235),
    Suite("tests", ".venv/tools/bin/python", ["tests"], 340, 230),
    Suite("voice-testkit", ".venv/tts/bin/python", ["libs/voice-testkit/tests"], 30, 4),
    Suite("voice-keys", ".venv/tts/bin/python", ["libs/voice-keys/tests"], 30, 2),
]
# `--compose` (.ci/run, where a Docker engine runs): the cpu profile built and run by the
# real Compose (`make test-compose`) as one more suite in a lane. Its core services take
# free ports (tests/compose/test_stack.py), so it runs beside the others.
# Set-up: the images built, ~10 min on a new machine (Debian base images, every layer),
# 1.5-2.5 min when only this checkout's code changed.
COMPOSE = Suite("compose", "", [], 400, 270, setup=["bash", "tests/compose/run.sh", "build"],
                setup_budget_s=1000, command=["bash", "tests/compose/run.sh", "check"])


@dataclass
class Result:
    name: str
    rc: int
    wall_s: float  # set-up included
    cpu_s: float  # user + system of the suite and the processes it waited for
    budget_s: int
    slowest: list[tuple[float, str]]
    setup_s: float = 0.0
    setup_budget_s: int = 0

    @property
    def over_budget(self) -> bool:
        return over_budget(self.__dict__)


def over_budget(r: dict) -> bool:
    setup = r.get("setup_s", 0.0)
    return r["wall_s"] - setup > r["budget_s"] or setup > r.get("setup_budget_s", 0)


def slowest_tests(xml: Path, n: int = 3) -> list[tuple[float, str]]:
    try:
        cases = ET.parse(xml).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        return []
    times = [(float(c.get("time", 0)), f"{c.get('classname', '').rsplit('.', 1)[-1]}"
                                       f"::{c.get('name')}") for c in cases]
    return sorted(times, reverse=True)[:n]


def call(cmd: list[str], log, env: dict[str, str] | None = None) -> tuple[int, float]:
    """The command's exit status and CPU seconds (its own and its waited-for children's)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run_suite(s: Suite, say) -> Result:
    log, xml = OUT / f"{s.name}.log", OUT / f"{s.name}.xml"
    py = s.python if os.path.isabs(s.python) else str(ROOT / s.python)
    t0 = time.monotonic()
    say(f"=== start {s.name} (budget {s.budget_s} s, log {log.relative_to(ROOT)})")
    with open(log, "w") as f:
        rc, cpu, setup_s = 0, 0.0, 0.0
        if s.setup:
            rc, cpu = call(s.setup, f, {**os.environ, "VLLM_VENV": VLLM_VENV})
            setup_s = time.monotonic() - t0
        if rc == 0:
            cmd = s.command or [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--durations=10", f"--junitxml={xml}", *s.args, *s.paths]
            rc, cpu_tests = call(cmd, f)
            cpu += cpu_tests
    r = Result(s.name, rc, time.monotonic() - t0, cpu, s.budget_s, slowest_tests(xml),
               setup_s, s.setup_budget_s)
    tail = log.read_text(errors="replace").splitlines()
    # A failure shows its whole report; a pass its summary line.
    shown = tail[-120:] if rc else tail[-1:]
    verdict = "FAILED" if rc else ("OVER BUDGET" if r.over_budget else "ok")
    setup = f" (set-up {setup_s:.0f} s, budget {s.setup_budget_s} s)" if s.setup else ""
    say("\n".join([*shown, f"=== {s.name}: rc={rc} in {r.wall_s:.0f} s{setup}, {cpu:.0f} "
                   f"CPU s (budget {s.budget_s} s): {verdict}"]))
    return r


def table(results: list[dict]) -> str:
    rows = [f"{'suite':<14} {'rc':>3} {'set-up s':>13} {'tests s':>12} {'CPU s':>6}"
            "  slowest tests"]
    for r in results:
        flag = "  OVER BUDGET" if over_budget(r) else ""
        slow = "; ".join(f"{t:.0f}s {name}" for t, name in r["slowest"])
        setup = r.get("setup_s", 0.0)
        setup_col = f"{setup:.0f}/{r['setup_budget_s']}" if r.get("setup_budget_s") else "-"
        tests_col = f"{r['wall_s'] - setup:.0f}/{r['budget_s']}"
        rows.append(f"{r['name']:<14} {r['rc']:>3} {setup_col:>13} {tests_col:>12} "
                    f"{r['cpu_s']:>6.0f}  {slow}{flag}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="suites to run (default: all)")
    ap.add_argument("--lanes", type=int, default=int(os.environ.get("CI_LANES", 2)))
    ap.add_argument("--table", action="store_true", help="print the last run's table")
    ap.add_argument("--compose", action="store_true", help="add `make test-compose`")
    a = ap.parse_args()
    times = OUT / "times.json"
    if a.table:
        print(table(json.loads(times.read_text())["suites"]))
        return 0
    known = {s.name: s for s in [*SUITES, COMPOSE]}
    unknown = [n for n in a.names if n not in known]
    if unknown:
        ap.error(f"unknown suite(s) {unknown}; known: {list(known)}")
    chosen = [known[n] for n in a.names] if a.names else SUITES
    if a.compose and COMPOSE not in chosen:
        chosen = [*chosen, COMPOSE]
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ["VOICE_REQUIRE_ORACLE"] = "1"
    # Two lanes on two cores: one math thread a process (OpenMP threads that spin between
    # parallel regions would burn the other lane's core). Tests that set threads still do.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    lock, results = threading.Lock(), []

    def say(text: str) -> None:
        with lock:
            print(text, flush=True)

    queue = sorted(chosen, key=lambda s: -s.expect_s)

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                s = queue.pop(0)
            r = run_suite(s, say)
            with lock:
                results.append(r)

    t0 = time.monotonic()
    threads = [threading.Thread(target=lane) for _ in range(min(a.lanes, len(chosen)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = {s.name: i for i, s in enumerate(chosen)}
    results.sort(key=lambda r: order[r.name])
    rows = [r.__dict__ for r in results]
    times.write_text(json.dumps({"wall_s": time.monotonic() - t0, "suites": rows}, indent=1))
    print(table(rows))
    print(f"=== suites: {time.monotonic() - t0:.0f} s over {a.lanes} lane(s)")
    failed = [r.name for r in results if r.rc]
    over = [r.name for r in results if r.over_budget]
    if failed:
        print(f"FAILED: {' '.join(failed)}")
    if over:
        print(f"OVER BUDGET: {' '.join(over)} (a budget is in .ci/suites.py: make the suite "
              "faster, or raise it with the reason in the commit)")
    if failed or over:
        return 1
    print("all test suites passed within their budgets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
