"""run_suite: run the AutoRTC cases against the agent, judge them, write the report.

    python -m voice_autortc.run_suite --transport direct --spawn-backends --quick
    python -m voice_autortc.run_suite --transport direct --tts-addr H:P --thinker-addr H:P
    python -m voice_autortc.run_suite --transport livekit            # LIVEKIT_* env
    python -m voice_autortc.run_suite ... --nightly 20 --compare .run/autortc/<run>

One run = one directory `<output_root>/<run trace id>/` with report.md, report.json,
plots/latency.png and cases/<case>/{input.wav, pre_rtc.wav, post_rtc_full.wav,
post_rtc_reply.wav, reply.png, capture.json}. Cases run one after another, each in a
fresh agent session (seed 003 14.9: per-turn isolation); a NO_REPLY / POST_SILENT /
ERROR capture is retried (`--retries`, seed 003 13.2). Exit code: 0 suite PASS,
1 suite FAIL, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import gates as gates_mod
from .audio import write_wav
from .audio_metrics import MetricConfig
from .cases import Case, CaseFile, load_cases
from .compare import baseline_kpi, compare_markdown, load_report
from .plots import latency_plot, reply_plot
from .progress import SuiteProgress
from .report import build_json, build_markdown, case_json, write_report
from .settings import AutoRTCSettings, load_settings
from .speech import USER_RATE, UserClip, make_barge_in, make_clip
from .transports.base import ERROR, NO_REPLY, POST_SILENT, Capture
from .verdict import CaseResult, judge_case, judge_suite

log = logging.getLogger("voice_autortc")
RETRY_ON = (NO_REPLY, POST_SILENT, ERROR)


def new_trace_id() -> str:
    return uuid.uuid4().hex[:16]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m voice_autortc.run_suite",
        description="AutoRTC: end-to-end voice tests of the agent (three rings, gates, "
                    "report.md). See services/autortc/README.md.")
    ap.add_argument("--transport", choices=("direct", "livekit"), default="direct")
    ap.add_argument("--cases", help="case file (JSON); default: the packaged all_cases.json")
    sel = ap.add_mutually_exclusive_group()
    sel.add_argument("--quick", action="store_true", help="only the cases marked quick (CI)")
    sel.add_argument("--case", action="append", default=[], metavar="ID",
                     help="run only this case (repeatable)")
    sel.add_argument("--nightly", type=int, nargs="?", const=0, metavar="N",
                     help="N turns cycling the nightly P0 cases (default: the file's turns)")
    ap.add_argument("--output-root", type=Path, help="default AUTORTC_OUTPUT_ROOT")
    ap.add_argument("--run-id", help="the run's trace id (default: random)")
    ap.add_argument("--gate", action="append", default=[], metavar="NAME=VALUE",
                    help="override a gate threshold (repeatable)")
    ap.add_argument("--compare", metavar="RUN", help="an earlier run dir or report.json: "
                    "regression table + baseline of the kpi_regression gate")
    ap.add_argument("--retries", type=int, help="retries of a NO_REPLY/POST_SILENT case")
    ap.add_argument("--no-greet", action="store_true", help="agent does not greet first")
    ap.add_argument("--no-progress", action="store_true", help="plain lines, no live bar")
    d = ap.add_argument_group("direct transport")
    d.add_argument("--spawn-backends", action="store_true",
                   help="start the TTS (preset:tiny) and thinker (tiny-random) servers")
    d.add_argument("--tts-addr", help="running TTS server host:port (default AGENT_TTS_ADDR)")
    d.add_argument("--thinker-addr", help="running thinker host:port (AGENT_THINKER_ADDR)")
    lk = ap.add_argument_group("livekit transport (LIVEKIT_URL/API_KEY/API_SECRET env)")
    lk.add_argument("--room-prefix", help="room name prefix the agent is dispatched to")
    lk.add_argument("--pre-rtc-dir", help="where the agent writes <trace_id>/pre_rtc.wav")
    return ap.parse_args(argv)


def select_cases(cf: CaseFile, a: argparse.Namespace) -> tuple[list[Case], str]:
    if a.nightly is not None:
        turns = cf.nightly_turns(a.nightly or None)
        return [c.model_copy(update={"id": f"{c.id}_t{i:03d}"})
                for i, c in enumerate(turns)], "nightly"
    if a.case:
        return cf.select(only=a.case), "cases"
    return cf.select(quick=a.quick), "quick" if a.quick else "full"


class Runner:
    """Runs cases over one transport; owns the event loop's resources of the run."""

    def __init__(self, a: argparse.Namespace, s: AutoRTCSettings, run_dir: Path,
                 agent_settings: Any = None) -> None:
        self.a, self.s, self.run_dir = a, s, run_dir
        self.agent_settings = agent_settings
        self.cfg = MetricConfig(valid_rms=s.valid_rms)

    async def capture(self, case: Case, clip: UserClip, barge: UserClip | None,
                      trace_id: str) -> Capture:
        if self.a.transport == "direct":
            from .transports import direct

            return await direct.run_case(case, clip, agent_settings=self.agent_settings,
                                         trace_id=trace_id, barge_clip=barge,
                                         greet=self.s.greet and not self.a.no_greet,
                                         valid_rms=self.s.valid_rms)
        from .transports import livekit as lk

        return await lk.run_case(case, clip, settings=self.s, trace_id=trace_id,
                                 barge_clip=barge)


def _save_case(run_dir: Path, r: CaseResult, clip: UserClip) -> None:
    d = run_dir / "cases" / r.case.id
    d.mkdir(parents=True, exist_ok=True)
    write_wav(d / "input.wav", clip.audio, USER_RATE)
    c = r.capture
    if len(c.full):
        write_wav(d / "post_rtc_full.wav", c.full, c.rate)
    if c.pre is not None:
        write_wav(d / "pre_rtc.wav", c.pre, c.pre_rate)
    if r.post is not None:
        write_wav(d / "post_rtc_reply.wav", r.post.audio, r.post.rate)
        label = r.case.fault_label()
        fault = f"[fault: {label}]" if label != "-" else "[clean]"
        reply_plot(d / "reply.png", case_id=r.case.id, post=r.post.audio, rate=r.post.rate,
                   arrivals=r.post.arrivals, pre=c.pre, pre_rate=c.pre_rate,
                   silence_dbfs=MetricConfig().silence_dbfs, gap_min_ms=40, title_extra=fault)
    (d / "capture.json").write_text(json.dumps(case_json(r), indent=2, default=float))


async def run_cases(runner: Runner, cases: list[Case], gates: tuple[gates_mod.Gate, ...],
                    base_dir: Path, progress: SuiteProgress) -> list[CaseResult]:
    results: list[CaseResult] = []
    retries = runner.a.retries if runner.a.retries is not None else runner.s.retries
    for case in cases:
        try:
            clip = make_clip(case.input, base_dir=base_dir, seed=case.id)
            bi = case.input.barge_in
            barge = make_barge_in(bi.text, case.input.voice) if bi else None
        except (RuntimeError, ValueError) as e:
            raise SystemExit(f"case {case.id}: cannot make the input speech: {e}") from None
        attempt = 0
        while True:
            attempt += 1
            progress.start_case(case.id, attempt)
            cap = await runner.capture(case, clip, barge, new_trace_id())
            r = judge_case(case, cap, gates, runner.cfg, attempts=attempt)
            if cap.status not in RETRY_ON or attempt > retries:
                break
            log.warning("case %s: capture %s (%s), retrying", case.id, cap.status, cap.error)
        _save_case(runner.run_dir, r, clip)
        m = r.metrics
        summary = (f"eot→audio={m.get('eot_to_first_audio_ms')} ms "
                   f"failed=[{', '.join(g.name for g in r.failed())}]")
        progress.end_case(case.id, r.verdict, cap.status, summary)
        results.append(r)
    return results


# With the spawned tiny models: the thinker is text-only (no ASR), so the agent hears
# through PocketSphinx (the STT stage runs for real); random tokens make replies long,
# so cap them. AGENT_* env vars still win.
# A random TTS never stops on its own (it runs to the frame cap): cap each utterance at
# 4 s (50 codec frames), keep the greeting one word, seed both models (same replies
# run after run, so --compare compares like with like).
TINY_AGENT_DEFAULTS = {"stt_backend": "offline", "llm_max_tokens": 8,
                       "greeting": "Hi.", "tts_max_frames": 50,
                       "llm_seed": 7, "tts_seed": 7}


def _agent_settings(a: argparse.Namespace, backends: Any) -> Any:
    from voice_agent.settings import load_settings as load_agent_settings

    over: dict[str, object] = {}
    if backends is not None:
        over = {k: v for k, v in TINY_AGENT_DEFAULTS.items()
                if f"AGENT_{k.upper()}" not in os.environ}
        over |= {"tts_addr": backends.tts_addr, "thinker_addr": backends.thinker_addr}
    if a.tts_addr:
        over["tts_addr"] = a.tts_addr
    if a.thinker_addr:
        over["thinker_addr"] = a.thinker_addr
    return load_agent_settings(**over)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so spawned backends are stopped, never orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s "
                        "%(message)s", stream=sys.stderr)
    s = load_settings(**{k: v for k, v in (("output_root", a.output_root),
                                           ("room_prefix", a.room_prefix),
                                           ("pre_rtc_dir", a.pre_rtc_dir)) if v})
    try:
        case_path, gates, cases, mode = _cases(a)
        old = load_report(a.compare) if a.compare else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.transport == "livekit" and not (s.livekit_url and s.livekit_api_key
                                         and s.livekit_api_secret):
        print("error: --transport livekit needs LIVEKIT_URL, LIVEKIT_API_KEY, "
              "LIVEKIT_API_SECRET", file=sys.stderr)
        return 2

    run_id = a.run_id or new_trace_id()
    run_dir = s.output_root / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load0 = [round(x, 2) for x in os.getloadavg()]
    t0 = time.monotonic()
    results = _run(a, s, run_dir, cases, gates, case_path)
    if results is None:
        return 2
    verdict, agg, suite_gates = judge_suite(results, gates,
                                            baseline_kpi(old) if old else None)
    run = {"trace_id": run_id, "transport": a.transport, "mode": mode,
           "case_file": str(case_path), "started_at": started,
           "duration_s": round(time.monotonic() - t0, 1),
           # Ring0 on a busy host measures the host: keep its load next to the results.
           "host_load": {"start": load0, "end": [round(x, 2) for x in os.getloadavg()],
                         "cpus": os.cpu_count()},
           "gates": {g.name: g.threshold for g in gates}}
    report = build_json(run, verdict, agg, suite_gates, results)
    md = _write(s, run_dir, report, results, gates, suite_gates, old)
    known = sum(r.verdict in ("XFAIL", "XPASS") for r in results)
    print(f"AutoRTC {verdict}: {sum(r.verdict == 'PASS' for r in results)}/{len(results)} "
          f"cases PASS{f', {known} known issue(s) (xfail)' if known else ''} · report {md}",
          flush=True)
    return 0 if verdict == "PASS" else 1


def _cases(a: argparse.Namespace) -> tuple[Path, tuple[gates_mod.Gate, ...], list[Case], str]:
    """The case file's path, its gates (with --gate's overrides), the cases this run
    takes and their mode; a ValueError names what is wrong with them."""
    cf, case_path = load_cases(a.cases)
    gates = gates_mod.configure({**cf.gates, **gates_mod.parse_overrides(a.gate)})
    for c in cf.cases:
        unknown = [n for n in c.expect_fail if n not in gates_mod.GATE_NAMES]
        if unknown:
            raise ValueError(f"case {c.id}: expect_fail names unknown gates: {unknown}")
    cases, mode = select_cases(cf, a)
    return case_path, gates, cases, mode


def _run(a: argparse.Namespace, s: AutoRTCSettings, run_dir: Path, cases: list[Case],
         gates: tuple[gates_mod.Gate, ...], case_path: Path) -> list[CaseResult] | None:
    """The cases' results, on backends started here (direct, --spawn-backends); None:
    they did not start (said)."""
    with contextlib.ExitStack() as stack:
        backends = None
        if a.transport == "direct" and a.spawn_backends:
            from .backends import spawn_backends

            print(f"starting TTS + thinker backends (logs: {run_dir / 'backends'})",
                  file=sys.stderr, flush=True)
            try:
                backends = stack.enter_context(spawn_backends(
                    run_dir / "backends", tts_python=s.tts_python, llm_python=s.llm_python,
                    timeout_s=s.backend_start_timeout_s))
            except RuntimeError as e:
                print(f"error: {e}", file=sys.stderr)
                return None
        agent_settings = _agent_settings(a, backends) if a.transport == "direct" else None
        runner = Runner(a, s, run_dir, agent_settings)
        progress = stack.enter_context(SuiteProgress(len(cases), live=None if not a.no_progress
                                                     else False))
        return asyncio.run(run_cases(runner, cases, gates, case_path.parent, progress))


def _write(s: AutoRTCSettings, run_dir: Path, report: dict[str, Any], results: list[CaseResult],
           gates: tuple[gates_mod.Gate, ...], suite_gates: list[gates_mod.GateResult],
           old: dict[str, Any] | None) -> Path:
    """The report (JSON, markdown, the latency plot) in `run_dir`, `latest` pointing at
    it; returns the markdown's path."""
    (run_dir / "plots").mkdir(exist_ok=True)
    rows = [{"case_id": r.case.id, **r.metrics} for r in results if r.case.priority == "P0"]
    gate_ms = next(g.threshold for g in gates if g.name == "eot_to_first_audio_p95")
    latency_plot(run_dir / "plots" / "latency.png", rows, gate_ms)
    cmp_md = compare_markdown(old, report) if old else ""
    _, md = write_report(run_dir, report, build_markdown(report, results, suite_gates, cmp_md))
    latest = s.output_root / "latest"
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(run_dir.name)
    return md


if __name__ == "__main__":
    raise SystemExit(main())
