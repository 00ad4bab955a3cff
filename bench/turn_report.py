"""The turn-taking numbers of bench/turn_eval.py, from its per-turn rows: the rule that
turns a p_end into a wait, the summary by detector and min delay (split by family, kind
and source), the printed table and the plot. Knows nothing of audio or models.

Per turn, after the speaker stops (stop_s), the agent waits
    max(hangover, min_delay if p_end >= 0.5 else max_delay)
(the VAD's hangover first: no decision comes before it), and a turn the detector finds
complete whose transcript has at most `short_words` words waits at least `short_delay`
(the agent's AGENT_SHORT_TURN_WORDS / _DELAY_S). Then:
- cut-off: an unfinished turn whose wait is shorter than its pause (resume_s - stop_s;
  a null resume_s: any end cuts);
- latency: a complete turn's wait (its end of turn -> the agent's decision);
- held: a complete turn held open (p_end < 0.5): it waits the whole max delay;
- long hold: a complete turn that waits >= 1 s (LONG_HOLD_S; with the agent's max delay of
  1 s, the held ones, and every turn at a min delay of 1 s);
- cut inside: a complete or unfinished turn with a silence inside its speech before
  stop_s (each row's `inner`, judged on the words up to it) longer than that silence's
  wait: the turn ended before the speaker stopped;
- backchannel / noise: `taken` when the ear wrote words (the framework drops a turn with
  an empty transcript, whatever the detector says), `fast` when taken and ended at the
  min delay (p_end >= 0.5): the detector can delay such a turn, never refuse it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import pct

THRESHOLD = 0.5  # voice_agent.conversation.turn_end.THRESHOLD (imported there, kept here
# so that this module runs without the agent)
SPLITS = ("family", "kind", "source")
LONG_HOLD_S = 1.0
Row = dict[str, Any]
Short = tuple[int, float]  # (words, delay): a short turn's wait (the agent's 2, 0.35 s)
_WORD = re.compile(r"[A-Za-z0-9']+")  # as voice_agent.conversation.turn_end counts words


def wait_s(p: float, min_delay: float, max_delay: float, hangover: float,
           transcript: str = "", short: Short = (0, 0.0)) -> float:
    if p < THRESHOLD:
        return max(hangover, max_delay)
    if len(_WORD.findall(transcript)) <= short[0]:
        min_delay = max(min_delay, short[1])
    return max(hangover, min_delay)


def is_cut(row: Row, wait: float) -> bool:
    if row["resume_s"] is None:
        return True
    return wait < row["resume_s"] - row["stop_s"]


def source_of(rows: list[Row]) -> str:
    """"synthetic", "feedback", ... or "mixed(a+b)": what every number stands on."""
    kinds = sorted({r.get("source") or "unknown" for r in rows})
    return kinds[0] if len(kinds) == 1 else f"mixed({'+'.join(kinds)})"


def _split(rows: list[Row], stat: Callable[[list[Row]], dict[str, Any]]) -> dict[str, Any]:
    """`stat` of all rows, of each family / kind / source, and of each family's kinds
    ("flite/after-to": what one synthesizer's voices do with one kind of pause)."""
    out = stat(rows)
    for key in SPLITS:
        groups: dict[str, list[Row]] = defaultdict(list)
        for r in rows:
            groups[r.get(key) or "?"].append(r)
        out[f"by_{key}"] = {g: stat(rs) for g, rs in sorted(groups.items())}
    both: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        both[f"{r.get('family') or '?'}/{r.get('kind') or '?'}"].append(r)
    out["by_family_kind"] = {g: stat(rs) for g, rs in sorted(both.items())}
    return out


def _rate(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def summarize_one(rows: list[Row], detector: str, min_delay: float, max_delay: float,
                  hangover: float, short: Short = (0, 0.0)) -> dict[str, Any]:
    """The numbers of one detector at one min delay."""
    def wait(r: Row) -> float:
        return wait_s(r["p_end"][detector], min_delay, max_delay, hangover, r["transcript"],
                      short)

    def cutoffs(rs: list[Row]) -> dict[str, Any]:
        cut = sum(is_cut(r, wait(r)) for r in rs)
        return {"rate": _rate(cut, len(rs)), "cut": cut, "n": len(rs)}

    def latency(rs: list[Row]) -> dict[str, Any]:
        ms = [wait(r) * 1e3 for r in rs]
        return {"p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "max_ms": max(ms, default=None),
                "n": len(rs)}

    def held(rs: list[Row]) -> dict[str, Any]:
        k = sum(r["p_end"][detector] < THRESHOLD for r in rs)
        return {"count": k, "n": len(rs), "rate": _rate(k, len(rs))}

    def long_holds(rs: list[Row]) -> dict[str, Any]:
        k = sum(wait(r) >= LONG_HOLD_S - 1e-9 for r in rs)
        return {"count": k, "n": len(rs), "rate": _rate(k, len(rs))}

    def inside(rs: list[Row]) -> dict[str, Any]:
        k = sum(any(wait_s(g["p_end"][detector], min_delay, max_delay, hangover,
                           g["transcript"], short) < g["gap_s"] for g in r.get("inner", ()))
                for r in rs)
        return {"rate": _rate(k, len(rs)), "cut": k, "n": len(rs)}

    def taken(rs: list[Row]) -> dict[str, Any]:
        words = [r for r in rs if r["transcript"].strip()]
        fast = sum(r["p_end"][detector] >= THRESHOLD for r in words)
        return {"taken": len(words), "fast": fast, "n": len(rs),
                "rate": _rate(len(words), len(rs)), "fast_rate": _rate(fast, len(rs))}

    by_label: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_label[r["label"]].append(r)
    complete = by_label["complete"]
    held_texts = sorted(r["text"] or r["transcript"] for r in complete
                        if r["p_end"][detector] < THRESHOLD)
    long_texts = sorted(r["text"] or r["transcript"] for r in complete
                        if wait(r) >= LONG_HOLD_S - 1e-9)
    return {"source": source_of(rows),
            "cutoff": _split(by_label["unfinished"], cutoffs),
            "cut_inside": _split(complete + by_label["unfinished"], inside),
            "latency": _split(complete, latency),
            "held": {**_split(complete, held), "texts": held_texts},
            "long_holds": {**_split(complete, long_holds), "texts": long_texts},
            "backchannel": _split(by_label["backchannel"], taken),
            "noise": _split(by_label["noise"], taken)}


def summarize(rows: list[Row], detectors: list[str], min_delays: list[float],
              max_delay: float, hangover: float, short: Short = (0, 0.0)) -> dict[str, Any]:
    """{detector: {min delay (str): numbers}}."""
    return {d: {f"{m:g}": summarize_one(rows, d, m, max_delay, hangover, short)
                for m in min_delays} for d in detectors}


# --- printing ------------------------------------------------------------------------------

def _frac(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "-"


def _taken(t: dict[str, Any]) -> str:
    """"taken/n (fast)": with words / of all, and of those ended at the min delay."""
    return f"{t['taken']}/{t['n']} ({t['fast']})" if t["n"] else "-"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def table(summary: dict[str, Any], source: str) -> str:
    """The compact table: a row per (detector, min delay), then the cut-off rate and the
    p50 latency by family and by kind (a column per min delay), then the long holds."""
    tag = source.upper()
    lines = [f"[{tag}] turn-taking per detector and min delay ({tag} speech); cut-offs: "
             "unfinished turns; cut inside: turns ended at a silence inside their speech; "
             "ms, held and >=1 s: complete turns (long holds); taken "
             "(fast): the ear wrote words (and the detector ended the turn at the min delay)",
             f"{'detector':<8} {'min s':>5} {'cut-offs':>14} {'cut inside':>10} "
             f"{'p50 ms':>7} {'p95 ms':>7} "
             f"{'max ms':>7} {'held':>7} {'>=1 s':>7} {'backch. taken':>14} "
             f"{'noise taken':>14}  source"]
    for det, by_min in summary.items():
        for m, s in by_min.items():
            c, lat, h = s["cutoff"], s["latency"], s["held"]
            b, nz = s["backchannel"], s["noise"]
            cut = f"{c['rate'] * 100:.1f}% {_frac(c['cut'], c['n'])}" if c["n"] else "-"
            ins = s["cut_inside"]
            lines.append(f"{det:<8} {m:>5} {cut:>14} {_frac(ins['cut'], ins['n']):>10} "
                         f"{_ms(lat['p50_ms']):>7} "
                         f"{_ms(lat['p95_ms']):>7} {_ms(lat['max_ms']):>7} "
                         f"{_frac(h['count'], h['n']):>7} "
                         f"{_frac(s['long_holds']['count'], h['n']):>7} "
                         f"{_taken(b):>14} {_taken(nz):>14}"
                         f"  {s['source']}")
    mins = list(next(iter(summary.values())))
    for title, metric, field, fmt in (
            ("cut-off rate %", "cutoff", "rate", lambda v: f"{v * 100:.0f}"),
            ("cut-inside rate %", "cut_inside", "rate", lambda v: f"{v * 100:.1f}"),
            ("complete turns' p50 latency ms", "latency", "p50_ms", lambda v: f"{v:.0f}")):
        lines += ["", f"[{tag}] {title} by family, kind, and family and kind; columns: "
                  "min delay s",
                  f"{'detector':<8} {'group':<32} " + " ".join(f"{m:>5}" for m in mins)]
        for det, by_min in summary.items():
            first = by_min[mins[0]][metric]
            for split in ("by_family", "by_kind", "by_family_kind"):
                for group in first[split]:
                    vals = [by_min[m][metric][split][group][field] for m in mins]
                    n = first[split][group]["n"]
                    lines.append(f"{det:<8} {f'{group} (n={n})':<32} " + " ".join(
                        f"{'-' if v is None else fmt(v):>5}" for v in vals))
    lines += ["", f"[{tag}] complete turns held to the max delay (the same at every min delay)"]
    for det, by_min in summary.items():
        h = by_min[mins[0]]["held"]
        texts = sorted(set(h["texts"]), key=lambda t: (-h["texts"].count(t), t))
        shown = "; ".join(f"{t} (x{h['texts'].count(t)})" for t in texts[:8])
        lines.append(f"{det:<8} {_frac(h['count'], h['n']):>7}  {shown}"
                     + (f"; +{len(texts) - 8} more" if len(texts) > 8 else ""))
    return "\n".join(lines)


# --- plot ----------------------------------------------------------------------------------

MARKERS = {"espeak-ng": "o", "flite": "s", "recorded": "^", "noise": "x"}


def plot(summary: dict[str, Any], source: str, path: Path) -> bool:
    """Cut-off rate vs p50 latency, a curve per detector over the min delays (its label:
    how many complete turns it held), a marker per family; False when matplotlib is not
    importable (nothing written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, (det, by_min) in enumerate(summary.items()):
        color = f"C{i}"
        xs = [s["latency"]["p50_ms"] for s in by_min.values()]
        ys = [(s["cutoff"]["rate"] or 0) * 100 for s in by_min.values()]
        held = next(iter(by_min.values()))["held"]
        ax.plot(xs, ys, "-", color=color, lw=2,  # p50 hides the holds: the label says them
                label=f"{det} (all; {held['count']}/{held['n']} complete held to max)")
        for fam in next(iter(by_min.values()))["cutoff"]["by_family"]:
            fx = [s["latency"]["by_family"].get(fam, {}).get("p50_ms") for s in by_min.values()]
            fy = [(s["cutoff"]["by_family"][fam]["rate"] or 0) * 100 for s in by_min.values()]
            ax.plot(fx, fy, MARKERS.get(fam, "d"), color=color, ms=5, alpha=0.7, ls=":",
                    label=f"{det} {fam}")
    ax.set_xlabel("complete turns: end of turn -> decision, p50 (ms)")
    ax.set_ylabel("unfinished turns cut off (%)")
    ax.set_title(f"Turn-taking on {source} speech: one point per min delay")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
