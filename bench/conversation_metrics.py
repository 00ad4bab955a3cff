"""bench/conversations.py's numbers, from each caller's raw timelines (pure, no I/O).

A caller's record (bench/caller.py) holds, on one clock (seconds from the level's start):
its turns as sent (`speech_start_s`: the message carrying the first speech sample;
`t_end_s`: the one carrying the last; a paused turn's `pause_start_s`/`pause_end_s`), every
reply frame received (`frames`: [arrival, RMS]) and every event (`events`: [arrival, msg]:
state, transcript, latency, clear, error).

Per turn, in its window (its first speech sample -> the next turn's):
- the reply starts at the first audible frame (RMS >= `audible_rms`) at or after the
  turn's end and after any `clear` in the window (the end of a reply this turn's speech
  cut), that follows `segment_gap_s` without audible audio (not the tail of a reply
  still playing); `eot_to_first_audio_ms` = that arrival - `t_end_s`;
- answered: a reply within `answer_timeout_s` of the turn's end;
- false cut-off (turns with a pause inside): audible reply audio received after the
  pause began and before the turn's last speech sample;
- holes: gaps over `hole_ms` between received frames inside the reply (the agent paces
  20 ms frames in real time: a gap is a host that did not keep up), except across a
  "paused" state (the duplex controller holds a reply while the user talks over it);
  reported as their missing audio over the reply's span;
- the agent's own record (`latency` message, the last in the window up to the reply's
  first frame) and the agent's eot_to_first_audio_ms minus the caller's;
- on the turn whose reply was interrupted: the interruption's first speech sample ->
  the last frame of that reply received (`interrupt_to_silence_ms`), -> the agent's
  `clear` (`interrupt_to_clear_ms`), and frames of it after the clear
  (`clear_to_silence_ms`: the last one's arrival - the clear's; 0 when none came after).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

from bench.stats import pct

AUDIBLE_DBFS = -50.0


@dataclass(frozen=True)
class Judge:
    """How a caller's timelines are read."""

    audible_rms: float = 32768 * 10 ** (AUDIBLE_DBFS / 20)  # ~104 of 32768
    answer_timeout_s: float = 8.0
    segment_gap_s: float = 0.3  # audible silence before a frame that starts a reply
    hole_ms: float = 100.0
    frame_ms: float = 20.0


@dataclass(frozen=True)
class Thresholds:
    """The level's pass flag (defaults: the issue's targets)."""

    max_p95_ms: float = 500.0
    max_p50_ms: float = 350.0
    max_unanswered: int = 0
    max_barge_in_silence_ms: float = 40.0
    max_false_cutoff_rate: float = 0.05
    max_hole_fraction: float = 0.0
    max_metric_diff_ms: float = 30.0
    max_refused: int = 0


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1000.0, 2)


def _reply_start(aud: list[float], bound: float, limit: float, gap: float) -> float | None:
    """The first audible arrival in [bound, limit) that follows `gap` s of no audible
    audio (aud sorted)."""
    for i, a in enumerate(aud):
        if a < bound:
            continue
        if a >= limit:
            return None
        if i == 0 or a - aud[i - 1] >= gap:
            return a
    return None


def _holes(ts: list[float], pauses: list[float], j: Judge) -> tuple[int, float]:
    n, missing = 0, 0.0
    for a, b in itertools.pairwise(ts):
        if (b - a) * 1000 > j.hole_ms and not any(a < p < b for p in pauses):
            n += 1
            missing += (b - a) * 1000 - j.frame_ms
    return n, round(missing, 2)


def turn_rows(rec: dict[str, Any], j: Judge) -> list[dict[str, Any]]:
    """One row per turn the caller spoke, with the raw moments it was computed from."""
    frames = sorted(rec.get("frames", []))
    all_t = [t for t, _ in frames]
    aud = [t for t, r in frames if r >= j.audible_rms]
    events = rec.get("events", [])
    clears = sorted(t for t, e in events if e.get("type") == "clear")
    states = sorted((t, e.get("state")) for t, e in events if e.get("type") == "state")
    paused = [t for t, st in states if st == "paused"]
    lats = [(t, e) for t, e in events if e.get("type") == "latency"]
    turns = rec.get("turns", [])
    end = rec.get("ended_s") if rec.get("ended_s") is not None else math.inf
    starts = [tu["speech_start_s"] for tu in turns] + [end]
    rows: list[dict[str, Any]] = []
    for k, tu in enumerate(turns):
        w0, w1, t_end = starts[k], starts[k + 1], tu["t_end_s"]
        bound = max([t_end, *(c for c in clears if w0 <= c < w1)])
        first = _reply_start(aud, bound, w1, j.segment_gap_s)
        answered = first is not None and first - t_end <= j.answer_timeout_s
        nxt = turns[k + 1] if k + 1 < len(turns) else None
        interrupted = nxt is not None and nxt.get("interrupts") == k
        clear_next = None
        if interrupted:
            clear_next = next((c for c in clears if starts[k + 1] <= c < starts[k + 2]), None)
            limit = clear_next + j.segment_gap_s if clear_next is not None else nxt["t_end_s"]
        else:
            limit = w1
        reply = [t for t in all_t if first is not None and first <= t < limit]
        holes, hole_ms = _holes(reply, paused, j)
        span = (reply[-1] - reply[0]) * 1000 + j.frame_ms if reply else 0.0
        row: dict[str, Any] = {
            "caller": rec.get("caller"), "turn": k, "kind": tu["kind"], "text": tu["text"],
            "voice": rec.get("voice"), "wpm": rec.get("wpm"), "pause_ms": tu.get("pause_ms", 0),
            "speech_start_s": w0, "t_end_s": t_end, "reply_bound_s": round(bound, 6),
            "first_reply_s": first,
            "eot_to_first_audio_ms": _ms(t_end, first) if answered else None,
            "answered": answered, "false_cutoff": None, "early_audio_ms": None,
            "reply_frames": len(reply), "reply_span_ms": round(span, 2), "holes": holes,
            "hole_ms": hole_ms, "hole_fraction": round(hole_ms / span, 4) if span else None,
            "agent": None, "agent_minus_caller_ms": None, "barge_in": None,
        }
        if tu["kind"] == "interrupt":
            row["interrupts"] = tu.get("interrupts")
        if tu.get("pause_start_s") is not None:
            early = [a for a in aud if tu["pause_start_s"] < a < t_end]
            row.update(pause_start_s=tu["pause_start_s"], pause_end_s=tu.get("pause_end_s"),
                       false_cutoff=bool(early),
                       early_audio_ms=_ms(early[0], t_end) if early else None)
        if first is not None:
            mine = [e for t, e in lats if w0 <= t <= first + 0.1]
            if mine:
                row["agent"] = {k2: v for k2, v in mine[-1].items() if k2 != "type"}
                agent_eot = row["agent"].get("eot_to_first_audio_ms")
                if agent_eot is not None and row["eot_to_first_audio_ms"] is not None:
                    row["agent_minus_caller_ms"] = round(
                        agent_eot - row["eot_to_first_audio_ms"], 2)
        if tu.get("barge_in_after_s") is not None:
            row["barge_in"] = _barge_in(tu, nxt if interrupted else None, first, reply,
                                        clear_next, states, j)
        rows.append(row)
    return rows


def _barge_in(tu: dict[str, Any], nxt: dict[str, Any] | None, first: float | None,
              reply: list[float], clear_at: float | None, states: list[tuple[float, Any]],
              j: Judge) -> dict[str, Any]:
    """The interruption of this turn's reply. It came during the reply if the reply's
    audio had begun and the agent was still speaking it (its state; a reply in an
    underrun has no frame then) or its last frame was under `segment_gap_s` before."""
    out: dict[str, Any] = {"after_s": tu["barge_in_after_s"], "spoken": nxt is not None}
    if nxt is None:  # no reply to interrupt: the caller did not speak it
        return out
    i0 = nxt["speech_start_s"]
    before = [t for t in reply if t < i0]
    state = next((st for t, st in reversed(states) if t <= i0), None)
    playing = bool(before) and (state in ("speaking", "paused")
                                or i0 - before[-1] < j.segment_gap_s)
    last = reply[-1] if reply else None
    after = [t for t in reply if clear_at is not None and t > clear_at]
    out.update({
        "interrupt_start_s": i0, "clear_s": clear_at, "last_reply_frame_s": last,
        "reply_audio_before_ms": _ms(first, i0) if first is not None else None,
        "state_at_interrupt": state, "during_reply": playing, "cleared": clear_at is not None,
        # 0: no frame of it came after the interruption began (it was in an underrun)
        "interrupt_to_silence_ms": max(0.0, _ms(i0, last) or 0.0) if playing else None,
        "interrupt_to_clear_ms": _ms(i0, clear_at),
        "clear_to_silence_ms": (max(0.0, _ms(clear_at, last) or 0.0)
                                if clear_at is not None and last is not None else None),
        "frames_after_clear": len(after),
    })
    return out


# -- a level ----------------------------------------------------------------------------------
def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def dist(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": _r(pct(values, 50)), "p95": _r(pct(values, 95)),
            "max": _r(max(values) if values else None)}


def summarize(n: int, recs: list[dict[str, Any]], rows: list[dict[str, Any]],
              th: Thresholds) -> dict[str, Any]:
    """The level's row: the numbers over every turn of every caller, and `pass`."""
    refused = [r for r in recs if r["status"] == "refused"]
    broken = [r for r in recs if r["status"] in ("dropped", "failed")]
    answered = [r for r in rows if r["answered"]]
    clean = [r for r in answered if not r["false_cutoff"]]  # the agent waited for the end
    paused = [r for r in rows if r["kind"] == "paused"]
    cut = [r for r in paused if r["false_cutoff"]]
    barges = [r["barge_in"] for r in rows if r["barge_in"] is not None]
    spoken = [b for b in barges if b["spoken"]]
    during = [b for b in spoken if b["during_reply"]]
    cleared = [b for b in during if b["cleared"]]
    interrupts = [r for r in rows if r["kind"] == "interrupt"]
    hole_ms = sum(r["hole_ms"] for r in rows)
    reply_ms = sum(r["reply_span_ms"] for r in rows)
    diffs = [r["agent_minus_caller_ms"] for r in clean if r["agent_minus_caller_ms"] is not None]
    stages: dict[str, dict[str, Any]] = {}
    keys = sorted({k for r in clean if r["agent"] for k, v in r["agent"].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)})
    for key in keys:
        d = dist([r["agent"][key] for r in clean if r["agent"]
                  and isinstance(r["agent"].get(key), int | float)])
        stages[key] = {"n": d["n"], "p50": d["p50"], "p95": d["p95"]}
    codes: dict[str, int] = {}
    for r in refused:
        c = (r.get("refusal") or {}).get("code", "?")
        codes[c] = codes.get(c, 0) + 1
    row: dict[str, Any] = {
        "conversations": n, "callers": len(recs),
        "completed": sum(r["status"] == "ok" for r in recs),
        "refused": len(refused), "refused_by_code": codes,
        "dropped_or_failed": len(broken),
        "errors": [f"caller {r['caller']}: {r['status']}: {r.get('error')}" for r in broken],
        "turns": len(rows), "answered": len(answered), "unanswered": len(rows) - len(answered),
        "eot_to_first_audio_ms": dist([r["eot_to_first_audio_ms"] for r in clean]),
        # complete turns answered over 1 s after their end: a held turn (the end-of-turn
        # wait doubted it), or a stack running late
        "slow_complete_turns": [
            {"text": r.get("text"), "eot_to_first_audio_ms": r["eot_to_first_audio_ms"]}
            for r in clean if r["kind"] == "plain" and r["eot_to_first_audio_ms"] > 1000],
        "paused_turns": len(paused), "false_cutoffs": len(cut),
        "false_cutoff_rate": round(len(cut) / len(paused), 4) if paused else None,
        "barge_ins": len(barges), "barge_ins_spoken": len(spoken),
        "barge_ins_during_reply": len(during), "barge_ins_cleared": len(cleared),
        "interrupt_to_silence_ms": dist([b["interrupt_to_silence_ms"] for b in during]),
        "interrupt_to_clear_ms": dist([b["interrupt_to_clear_ms"] for b in cleared]),
        "clear_to_silence_ms": dist([b["clear_to_silence_ms"] for b in cleared
                                     if b["clear_to_silence_ms"] is not None]),
        "interrupts_unanswered": sum(not r["answered"] for r in interrupts),
        "holes": sum(r["holes"] for r in rows), "hole_ms": round(hole_ms, 2),
        "reply_ms": round(reply_ms, 2),
        "hole_fraction": round(hole_ms / reply_ms, 5) if reply_ms else None,
        "agent_minus_caller_ms": {**dist(diffs), "min": min(diffs, default=None),
                                  "abs_p95": dist([abs(x) for x in diffs])["p95"]},
        "stages_ms": stages,
        "mic_late_ms_max": max((r.get("mic_late_ms_max") or 0.0 for r in recs), default=None),
        "thresholds": asdict(th),
    }
    row["failures"] = failures(row, th)
    row["pass"] = not row["failures"]
    return row


def failures(row: dict[str, Any], th: Thresholds) -> list[str]:
    out = []
    e = row["eot_to_first_audio_ms"]
    if row["refused"] > th.max_refused:
        out.append(f"{row['refused']} callers refused ({row['refused_by_code']})")
    if row["dropped_or_failed"]:
        out.append(f"{row['dropped_or_failed']} callers dropped or failed")
    if e["n"] == 0:
        out.append("no answered turn")
    else:
        if e["p95"] > th.max_p95_ms:
            out.append(f"EoT -> first audio p95 {e['p95']} ms > {th.max_p95_ms:g}")
        if e["p50"] > th.max_p50_ms:
            out.append(f"EoT -> first audio p50 {e['p50']} ms > {th.max_p50_ms:g}")
    if row["unanswered"] > th.max_unanswered:
        out.append(f"{row['unanswered']} of {row['turns']} turns unanswered")
    rate = row["false_cutoff_rate"]
    if rate is not None and rate > th.max_false_cutoff_rate:
        out.append(f"false cut-offs {row['false_cutoffs']}/{row['paused_turns']} paused turns")
    if row["barge_ins_during_reply"] < row["barge_ins"]:
        out.append(f"barge-in exercised on {row['barge_ins_during_reply']} of "
                   f"{row['barge_ins']} dialogs (the reply was over or never came)")
    if row["barge_ins_cleared"] < row["barge_ins_during_reply"]:
        out.append(f"{row['barge_ins_during_reply'] - row['barge_ins_cleared']} barge-ins "
                   "never cleared the reply")
    c = row["clear_to_silence_ms"]
    if c["max"] is not None and c["max"] > th.max_barge_in_silence_ms:
        out.append(f"reply audio {c['max']} ms after the clear > "
                   f"{th.max_barge_in_silence_ms:g}")
    if row["hole_fraction"] is not None and (
            row["hole_fraction"] > th.max_hole_fraction if th.max_hole_fraction > 0
            else row["holes"] > 0):
        out.append(f"{row['holes']} holes in the replies ({row['hole_ms']} ms of "
                   f"{row['reply_ms']} ms)")
    d = row["agent_minus_caller_ms"]["abs_p95"]
    if d is not None and d > th.max_metric_diff_ms:
        out.append(f"the agent's EoT -> first audio differs from the caller's by {d} ms "
                   f"(p95 of |diff|) > {th.max_metric_diff_ms:g}")
    return out
