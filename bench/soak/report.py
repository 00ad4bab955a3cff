"""The summary: percentiles, the checks, the headline."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Protocol

from bench.soak.server import Server, server_info
from bench.stats import pct


class SoakState(Protocol):
    """What the summary reads of a finished soak (`run.Soak`; no import of it here:
    run imports this module)."""

    a: argparse.Namespace
    samples: list[dict[str, Any]]
    server: Server
    interrupted: bool
    server_died: bool


def dist(values: list[float], qs: tuple[float, ...] = (50, 95, 99)) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    for q in qs:
        out[f"p{q:g}"] = _r(pct(values, q))
    out["max"] = _r(max(values) if values else None)
    return out


def peak_inflight(recs: list[dict[str, Any]]) -> int:
    """Most calls open at once, from each call's dispatch and end (one monotonic clock)."""
    edges = sorted(e for r in recs if r["end_ms"] is not None
                   for e in ((r["dispatch_at"], 1), (r["dispatch_at"] + r["end_ms"] / 1e3, -1)))
    peak = now = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def rejection_examples(rejected: list[dict[str, Any]], per_kind: int = 4) -> list[str]:
    """A few of the server's refusal messages, spread over the run, per kind of message
    (the words before the first digit): what the admission saw when it refused."""
    kinds: dict[str, list[str]] = {}
    for r in rejected:
        kinds.setdefault(re.split(r"\d", r["message"], maxsplit=1)[0], []).append(r["message"])
    out = []
    for msgs in kinds.values():
        step = max(1, len(msgs) // per_kind)
        out += msgs[::step][:per_kind]
    return out


def summarize(soak: SoakState, load: dict[str, Any], model: str, planned: int,
              recs: list[dict[str, Any]], active: float | None, final: dict[str, Any],
              alive: bool, health: str, metrics_end: dict[str, float],
              faults: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary of the ended `soak`: counts, percentiles, the checks."""
    a = soak.a
    admitted = [r for r in recs if r["outcome"] not in ("rejected",)
                and r["started_ms"] is not None]
    rejected = [r for r in recs if r["outcome"] == "rejected"]
    frames = sum(r["frames"] for r in recs)
    late_frames = sum(r["late_frames"] for r in recs)
    ttfa = [r["ttfa_ms"] for r in admitted if r["ttfa_ms"] is not None]
    gpu = _gpu_memory(soak, final)
    capacity = _capacity_gate(ttfa, late_frames)
    checks = {**_server_checks(soak, faults, alive, health, active),
              **_gpu_memory_check(a, gpu),
              **_call_checks(soak, recs, planned, load),
              **_run_checks(soak, capacity)}
    failures = [f"{k}: {json.dumps({x: y for x, y in v.items() if x != 'pass'})[:400]}"
                for k, v in checks.items() if v["pass"] is False]
    return {
        "pass": not failures,
        "failures": failures,
        **_run_settings(soak, model, metrics_end),
        "arrivals": len(recs),
        "achieved_rate": round(len(recs) / a.duration, 3),
        **_counts(recs),
        **_latencies(recs, admitted, ttfa),
        "truncated_utterances": sum(r["truncated"] for r in recs),
        "no_audio_calls": sum(1 for r in admitted if r["outcome"] == "ok"
                              and r["frames"] == 0),
        "frames": frames, "audio_s": round(frames * a.frame_ms / 1e3, 1),
        "audio_s_per_wall_s": _r(frames * a.frame_ms / 1e3 / a.duration),
        "peak_inflight": peak_inflight(recs),
        "underruns": _underruns(a, recs, frames, late_frames),
        "rejections": {"n": len(rejected),
                       "latency_ms": dist([r["end_ms"] for r in rejected], (50, 95)),
                       "examples": rejection_examples(rejected)},
        "capacity_gate": capacity,
        "client": _client(a, recs, load),
        "gpu_memory_mb": gpu,
        "server_metrics_end": _server_metrics_end(metrics_end),
        "server_rss_mb": {"first": soak.samples[0].get("server_rss_mb"),
                          "last": final.get("server_rss_mb")},
        "checks": checks,
        "samples": soak.samples,
    }


# --- the summary's sections, in its order ---------------------------------------------


def _run_settings(soak: SoakState, model: str, metrics_end: dict[str, float]
                  ) -> dict[str, Any]:
    """What was run: the protocol and rate, the server, the load's shape."""
    a = soak.a
    return {
        "protocol": a.protocol, "rate": a.rate, "duration_s": round(a.duration, 1),
        "duration_requested_s": a.duration_requested, "seed": a.seed, "procs": a.procs,
        "server": {"addr": soak.server.addr, "model": model,
                   "started_here": a.start_server, "info": server_info(metrics_end),
                   **({"device": a.device, "max_sessions": a.max_sessions}
                      if a.start_server else {})},
        "load": {"stream_text": a.stream_text, "frames_per_char": a.frames_per_char,
                 "chars": [a.min_chars, a.max_chars], "frame_ms": a.frame_ms,
                 "sample_rate": a.sample_rate, "stop_share": a.stop_share,
                 "reset_share": a.reset_share, "cancel_share": a.cancel_share},
    }


def _counts(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """How the calls ended (outcome, status code), and the planned actions done/skipped."""
    by_outcome: dict[str, int] = {}
    by_code: dict[str, int] = {}
    for r in recs:
        by_outcome[r["outcome"]] = by_outcome.get(r["outcome"], 0) + 1
        by_code[r["code"]] = by_code.get(r["code"], 0) + 1
    actions: dict[str, dict[str, int]] = {}
    for r in recs:
        if r["kind"] != "normal":
            d = actions.setdefault(r["kind"], {"planned": 0, "done": 0, "skipped": 0})
            d["planned"] += 1
            if r["action"] == r["kind"]:
                d["done"] += 1
            elif r["action"] == "skipped":
                d["skipped"] += 1
    return {"counts": by_outcome, "by_code": by_code, "actions": actions}


def _latencies(recs: list[dict[str, Any]], admitted: list[dict[str, Any]],
               ttfa: list[float]) -> dict[str, Any]:
    """The latency distributions: client and server TTFA (and its parts), end to end."""
    return {
        "ttfa_ms": dist(ttfa),
        "session_started_ms": dist([r["started_ms"] for r in admitted]),
        "server_ttfa_ms": dist([r["server_ttfa_ms"] for r in admitted
                                if r["server_ttfa_ms"] is not None]),
        "server_parts_ms": {k: dist([r["server_parts_ms"][k] for r in admitted
                                     if r.get("server_parts_ms")])
                            for k in ("queue", "prefill", "first_packet")},
        "e2e_ms": dist([r["e2e_ms"] for r in recs if r["e2e_ms"] is not None]),
        "reset_ttfa_ms": dist([r["reset_ttfa_ms"] for r in recs
                               if r["reset_ttfa_ms"] is not None]),
    }


def _underruns(a: argparse.Namespace, recs: list[dict[str, Any]], frames: int,
               late_frames: int) -> dict[str, Any]:
    """Frames and utterances that reached the client later than real time allows."""
    utts = sum(r["utterances"] for r in recs)
    late_utts = sum(r["late_utterances"] for r in recs)
    return {
        "tolerance_ms": a.underrun_tolerance_ms,
        "late_frames": late_frames, "frames": frames,
        "late_frames_over_20ms": sum(r["late20_frames"] for r in recs),
        "late_frames_over_100ms": sum(r["late100_frames"] for r in recs),
        "late_frame_share": _r(late_frames / frames, 5) if frames else None,
        "utterances_with_underrun": late_utts, "utterances": utts,
        "utterance_share": _r(late_utts / utts, 4) if utts else None,
        "max_late_ms": _r(max((r["max_late_ms"] for r in recs), default=0.0)),
        "call_max_late_ms": dist([r["max_late_ms"] for r in recs if r["frames"]]),
    }


def _capacity_gate(ttfa: list[float], late_frames: int) -> dict[str, bool]:
    """Whether the run met real-time capacity: TTFA p95 <= 100 ms and no underrun."""
    ttfa_p95 = pct(ttfa, 95)
    capacity = {"ttfa_p95_le_100ms": ttfa_p95 is not None and ttfa_p95 <= 100.0,
                "zero_underruns": late_frames == 0}
    capacity["met"] = all(capacity.values())
    return capacity


def _client(a: argparse.Namespace, recs: list[dict[str, Any]], load: dict[str, Any]
            ) -> dict[str, Any]:
    """The load generator's own lag: late dispatches and loop lag can pose as TTFA."""
    dl = [r["dispatch_late_ms"] for r in recs]
    lag = load["loop_lag_ms"]
    cpu_shares = [p["cpu_share"] for p in load["procs"]]
    client_lagging = bool((pct(dl, 99) or 0) > a.client_lag_warn_ms
                          or (pct(lag, 99) or 0) > a.client_lag_warn_ms
                          or any(s > 0.9 for s in cpu_shares))
    return {
        "dispatch_late_ms": dist(dl, (50, 99)),
        "loop_lag_ms": dist(lag, (50, 99)),
        "procs": load["procs"],
        "grpc_write_fix": load["grpc_write_fix"],
        "lagging": client_lagging,
        "note": ("client-side lag can show up as TTFA and underruns: use --procs"
                 if client_lagging else ""),
    }


def _gpu_memory(soak: SoakState, final: dict[str, Any]) -> dict[str, Any]:
    """GPU memory: the first sample after warm-up against the last one (calls ended)."""
    a = soak.a
    warm = a.warmup if a.warmup is not None else min(30.0, max(2.0, 0.2 * a.duration))
    gpu: dict[str, Any] = {"warmup_s": warm}
    for key in ("allocated_mb", "reserved_mb", "smi_mb"):
        series = [s for s in soak.samples if s.get(key) is not None]
        after = next((s for s in series if s["t"] >= warm), None)
        if after is None or final.get(key) is None:
            continue
        gpu[key] = {"after_warmup": after[key], "last": final[key],
                    "max": max(s[key] for s in series),
                    "growth": round(final[key] - after[key], 1)}
    return gpu


def _server_metrics_end(metrics_end: dict[str, float]) -> dict[str, Any]:
    """The server's own counters at the end: sessions, frames, errors, engine steps."""

    def mval(prefix: str) -> dict[str, float]:
        return {k: v for k, v in metrics_end.items() if k.startswith(prefix)}

    step_n = metrics_end.get("tts_engine_step_seconds_count") or 0
    batch_n = metrics_end.get("tts_engine_batch_size_count") or 0
    return {
        "active_sessions": metrics_end.get("tts_active_sessions"),
        "frames_sent": metrics_end.get("tts_frames_sent_total"),
        "flow_control_pauses": metrics_end.get("tts_flow_control_pauses_total"),
        "errors": mval("tts_errors_total{"),
        "admission_rejected": mval("tts_admission_rejected_total{"),
        "utterances": mval("tts_utterances_total{"),
        "steps": step_n,
        "step_ms_mean": _r(1e3 * metrics_end.get("tts_engine_step_seconds_sum", 0)
                           / step_n) if step_n else None,
        "batch_mean": _r(metrics_end.get("tts_engine_batch_size_sum", 0) / batch_n)
        if batch_n else None,
    }


# --- the checks (a failed one fails the soak; None: not judged) -----------------------


def _check(ok: bool | None, **detail: Any) -> dict[str, Any]:
    """One check's entry: its verdict and what it was judged on."""
    return {"pass": ok, **detail}


def _server_checks(soak: SoakState, faults: dict[str, Any], alive: bool, health: str,
                   active: float | None) -> dict[str, dict[str, Any]]:
    """The server's health: no engine fault or error log, alive, serving, no leaked slot."""
    a = soak.a
    return {
        "engine_faults": _check(not faults["counts"] if faults["log"] else None,
                                log=faults["log"], counts=faults["counts"],
                                lines=faults["lines"]),
        "no_error_logs": _check(None if not faults["log"] or a.allow_error_logs
                                else not faults["errors"], errors=faults["errors"],
                                lines=faults["error_lines"]),
        "server_alive": _check(alive, health=health,
                               exit_code=None if alive
                               else soak.server.proc.returncode),  # type: ignore[union-attr]
        "server_serving": _check(health == "SERVING", health=health),
        "no_leaked_slots": _check(None if active is None else active == 0,
                                  active_sessions=active),
    }


def _gpu_memory_check(a: argparse.Namespace, gpu: dict[str, Any]
                      ) -> dict[str, dict[str, Any]]:
    """GPU memory did not grow past the bound after warm-up (allocated, else nvidia-smi)."""
    gate_key = next((k for k in ("allocated_mb", "smi_mb") if k in gpu), None)
    return {"gpu_memory_flat": _check(
        None if gate_key is None else gpu[gate_key]["growth"] <= a.gpu_mem_growth_mb,
        source=gate_key, bound_mb=a.gpu_mem_growth_mb,
        growth_mb=gpu[gate_key]["growth"] if gate_key else None)}


def _call_checks(soak: SoakState, recs: list[dict[str, Any]], planned: int,
                 load: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The calls: streams that kept the rules, no errors, every planned call recorded."""
    broken = [r for r in recs if r["violations"]]
    errors = [r for r in recs if r["outcome"] in ("error", "timeout", "hung")]
    return {
        "streams_intact": _check(
            not broken, broken=len(broken),
            examples=[{"index": r["index"], "kind": r["kind"], "violations": r["violations"]}
                      for r in broken[:5]]),
        "no_errors": _check(
            not errors, errors=len(errors),
            examples=[{"index": r["index"], "outcome": r["outcome"], "code": r["code"],
                       "message": r["message"]} for r in errors[:5]]),
        "all_calls_accounted": _check(
            None if soak.interrupted or soak.server_died
            else len(recs) == planned and not load["crashed"],
            planned=planned, recorded=len(recs), crashed=load["crashed"]),
    }


def _run_checks(soak: SoakState, capacity: dict[str, bool]) -> dict[str, dict[str, Any]]:
    """The run's own checks, where they apply: not interrupted, clean exit, capacity."""
    a = soak.a
    checks: dict[str, dict[str, Any]] = {}
    if soak.interrupted:
        checks["not_interrupted"] = _check(
            False, note="SIGTERM/SIGINT before the end: partial")
    if a.start_server:
        checks["clean_shutdown"] = _check(soak.server.exit_code == 0,
                                          exit_code=soak.server.exit_code)
    if a.gate_capacity:
        checks["capacity"] = _check(capacity["met"], **capacity)
    return checks


def headline(s: dict[str, Any]) -> str:
    """The summary's key numbers on one line."""
    t, u, c = s["ttfa_ms"], s["underruns"], s["client"]
    rj = s["rejections"]["latency_ms"]
    gate = s["checks"]["gpu_memory_flat"]
    return (f"{s['protocol']} rate {s['rate']:g}/s for {s['duration_s']:g} s: "
            f"{s['arrivals']} calls "
            f"{json.dumps(s['counts'])}; client TTFA p50/p95/p99 {t['p50']}/{t['p95']}/"
            f"{t['p99']} ms; underruns {u['late_frames']}/{u['frames']} frames, "
            f"{u['utterances_with_underrun']}/{u['utterances']} utterances (max "
            f"{u['max_late_ms']} ms); rejections {s['rejections']['n']} (p50/p95/max "
            f"{rj['p50']}/{rj['p95']}/{rj['max']} ms); client p99 dispatch lateness "
            f"{c['dispatch_late_ms']['p99']} ms, loop lag {c['loop_lag_ms']['p99']} ms"
            f"{' (CLIENT LAGGING)' if c['lagging'] else ''}; GPU memory growth "
            f"{gate['growth_mb']} MB ({gate['source']})")
