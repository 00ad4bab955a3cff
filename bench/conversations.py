"""Conversations per GPU: N callers talking at once through the agent's real transport.

design.md section 6: each caller is a scripted multi-turn dialog of real speech (espeak-ng,
several voices and rates; bench/dialogs.py) over the agent's WebSocket `GET /v1/talk`
(bench/caller.py: 20 ms mic messages paced by the clock, silence between turns, every
reply frame and event kept with its arrival time). Every other turn has a 400-700 ms pause
inside; one reply per dialog is interrupted 0.5-1 s into its audio by a question that
must then be answered. Callers of a level start at random offsets over `--spread` s.

Per turn, on the caller's clock (bench/conversation_metrics.py): the last speech sample
sent -> the first audible reply frame received (EoT -> first audio), answered or not
(`--answer-timeout`), false cut-offs (reply audio before the last speech sample of a
turn with a pause inside), holes in the reply (gaps over 100 ms between frames the agent
paces in real time), barge-in (interruption -> last reply frame, -> the agent's `clear`,
frames after it), and the agent's own `latency` record beside it (its EoT -> first audio
minus the caller's). One JSON row per level of `--conversations`, with a `pass` flag
against the thresholds (defaults: the issue's targets), and the per-turn rows.

  .venv/agent/bin/python -m bench.conversations --addr 127.0.0.1:8003 \\
      --conversations 1,2,4 --out bench/out/conversations.json
  .venv/agent/bin/python -m bench.conversations --make-speech   # the speech cache only

Exit status 0 when every level passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.conversation_metrics import Judge, Thresholds, summarize, turn_rows
from bench.dialogs import (
    SpeechCache,
    Utterance,
    folder_turns,
    make_dialog,
    needed,
    render,
)

SPEECH_DIR = Path(__file__).resolve().parent / "out" / "conversation_speech"


def talk_url(addr: str) -> str:
    """host:port, http(s)://host:port[/...] or ws(s)://... -> the /v1/talk URL."""
    if "://" not in addr:
        addr = "ws://" + addr
    scheme, rest = addr.split("://", 1)
    scheme = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    host, _, path = rest.partition("/")
    return f"{scheme}://{host}/{path or 'v1/talk'}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.conversations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", action="append", default=[],
                   help="agent address (host:port or ws://host:port/v1/talk); several "
                   "(repeat or comma list): callers go round-robin (default 127.0.0.1:8003)")
    p.add_argument("--api-key", default=os.environ.get("AGENT_API_KEY", ""),
                   help="sent as Authorization: Bearer (default $AGENT_API_KEY)")
    p.add_argument("--voice", default="", help="the agent's voice for each call (start "
                   "message); default: the agent's own")
    p.add_argument("--conversations", default="1,2,4", help="levels N, comma list")
    p.add_argument("--turns", type=int, default=3, help="turns per dialog (then one "
                   "interrupting question over one of their replies; default %(default)s)")
    p.add_argument("--spread", type=float, default=3.0,
                   help="callers of a level start at random offsets over this many s")
    p.add_argument("--seed", type=int, default=0, help="dialogs and offsets")
    p.add_argument("--speech-dir", default=str(SPEECH_DIR), help="espeak-ng speech cache")
    p.add_argument("--turn-folder", default=None,
                   help="take the callers' turns from this turn folder (bench/turn_set.py's "
                   "synthetic set: pauses inside one utterance, espeak-ng and flite) in "
                   "place of the espeak-ng phrases; the interruptions stay espeak-ng")
    p.add_argument("--make-speech", action="store_true", help="make the speech and exit")
    p.add_argument("--answer-timeout", type=float, default=8.0,
                   help="a turn with no reply audio this long after its end is unanswered")
    p.add_argument("--quiet-s", type=float, default=1.0,
                   help="a reply has ended after this long without reply audio")
    p.add_argument("--audible-dbfs", type=float, default=-50.0,
                   help="a reply frame is audible when its RMS is above this")
    p.add_argument("--procs", type=int, default=1, help="client processes the callers are "
                   "spread over (each level row's mic_late_ms_max says if the client kept up)")
    p.add_argument("--gap-s", type=float, default=2.0, help="pause between levels")
    p.add_argument("--raw", action="store_true", help="keep each caller's raw timelines "
                   "(frames, events, turns as sent) in the JSON")
    p.add_argument("--out", default="", help="write the JSON here (after each level)")
    g = p.add_argument_group("pass thresholds (defaults: the issue's targets)")
    th = Thresholds()
    g.add_argument("--max-p95-ms", type=float, default=th.max_p95_ms)
    g.add_argument("--max-p50-ms", type=float, default=th.max_p50_ms)
    g.add_argument("--max-unanswered", type=int, default=th.max_unanswered)
    g.add_argument("--max-barge-in-silence-ms", type=float, default=th.max_barge_in_silence_ms,
                   help="reply audio received after the agent's clear")
    g.add_argument("--max-false-cutoff-rate", type=float, default=th.max_false_cutoff_rate,
                   help="of the turns with a pause inside")
    g.add_argument("--max-hole-fraction", type=float, default=th.max_hole_fraction,
                   help="missing reply audio over reply time (0: no hole at all)")
    g.add_argument("--max-metric-diff-ms", type=float, default=th.max_metric_diff_ms,
                   help="p95 of |agent's EoT -> first audio - the caller's|")
    g.add_argument("--max-refused", type=int, default=th.max_refused)
    a = p.parse_args(argv)
    try:
        a.levels = [int(x) for x in a.conversations.split(",") if x.strip()]
    except ValueError:
        p.error(f"--conversations: not a comma list of integers: {a.conversations!r}")
    if not a.levels or min(a.levels) < 1 or a.turns < 1:
        p.error("--conversations: levels >= 1; --turns >= 1")
    a.urls = [talk_url(x.strip()) for x in (",".join(a.addr) or "127.0.0.1:8003").split(",")
              if x.strip()]
    return a


def thresholds(a: argparse.Namespace) -> Thresholds:
    return Thresholds(**{k: getattr(a, k) for k in asdict(Thresholds())})


def progress(msg: str) -> None:
    print(f"conversations: {msg}", file=sys.stderr, flush=True)


def caller_line(n: int, rec: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    head = f"N={n} caller {rec['caller']} ({rec['voice']}, {rec['wpm']} wpm): {rec['status']}"
    if rec["status"] == "refused":
        return f"{head} {rec['refusal']}"
    eots = [r["eot_to_first_audio_ms"] for r in rows]
    barge = next((r["barge_in"] for r in rows if r["barge_in"]), None) or {}
    return (f"{head}; {sum(r['answered'] for r in rows)}/{len(rows)} turns answered, "
            f"EoT -> first audio ms {eots}; false cut-offs "
            f"{sum(bool(r['false_cutoff']) for r in rows)}; barge-in clear "
            f"{barge.get('interrupt_to_clear_ms')} ms after the interruption, "
            f"{barge.get('clear_to_silence_ms')} ms of audio after it"
            + (f"; {rec['error']}" if rec.get("error") else ""))


async def _call(n: int, idx: list[int], offsets: list[float], a: argparse.Namespace,
                dialogs: list[Any], speech: list[tuple[list[Utterance], Utterance]],
                judge: Judge, t0: float) -> list[dict[str, Any]]:
    """The callers `idx` of a level of N; their raw records as they finish."""
    import aiohttp  # the agent's venv has it; the pure parts above need it not

    from bench.caller import Caller, CallOpts

    opts = CallOpts(api_key=a.api_key, voice=a.voice, quiet_s=a.quiet_s,
                    answer_timeout_s=a.answer_timeout, audible_rms=judge.audible_rms)
    callers = [Caller(i, a.urls[i % len(a.urls)], dialogs[i], *speech[i],
                      offset_s=offsets[i], opts=opts, t0=t0) for i in idx]
    recs: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for fut in asyncio.as_completed([c.run(http) for c in callers]):
            rec = await fut
            if a.procs == 1:
                progress(caller_line(n, rec, turn_rows(rec, judge)))
            recs.append(rec)
    return recs


def _call_in_process(*args: Any) -> list[dict[str, Any]]:
    return asyncio.run(_call(*args))


def level(n: int, a: argparse.Namespace, dialogs: list[Any],
          speech: list[tuple[list[Utterance], Utterance]], judge: Judge
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """N callers at once (over `--procs` client processes, so that the client keeps its
    20 ms clock at high N); their raw records and per-turn rows."""
    rng = random.Random(f"{a.seed}:spread:{n}")
    offsets = [round(rng.uniform(0, a.spread), 3) if n > 1 else 0.0 for _ in range(n)]
    t0 = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every client process
    procs = max(1, min(a.procs, n))
    if procs == 1:
        recs = asyncio.run(_call(n, list(range(n)), offsets, a, dialogs, speech, judge, t0))
    else:
        import multiprocessing

        shares = [(n, list(range(k, n, procs)), offsets, a, dialogs, speech, judge, t0)
                  for k in range(procs)]
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            recs = [r for share in pool.starmap(_call_in_process, shares) for r in share]
    recs.sort(key=lambda r: r["caller"])
    rows: list[dict[str, Any]] = []
    for rec in recs:
        mine = turn_rows(rec, judge)
        if procs > 1:
            progress(caller_line(n, rec, mine))
        rows.extend(mine)
    rows.sort(key=lambda r: (r["caller"], r["turn"]))
    return recs, rows


def headline(r: dict[str, Any]) -> str:
    e, c = r["eot_to_first_audio_ms"], r["clear_to_silence_ms"]
    return (f"N={r['conversations']}: {r['turns']} turns ({r['unanswered']} unanswered, "
            f"{r['refused']} callers refused): EoT -> first audio p50 {e['p50']} p95 "
            f"{e['p95']} max {e['max']} ms; false cut-offs {r['false_cutoffs']}/"
            f"{r['paused_turns']}; barge-ins cleared {r['barge_ins_cleared']}/"
            f"{r['barge_ins']}, audio after clear max {c['max']} ms; holes {r['holes']}; "
            f"agent - caller p50 {r['agent_minus_caller_ms']['p50']} ms; pass {r['pass']}"
            + ("" if r["pass"] else f" ({'; '.join(r['failures'])})"))


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    dialogs = [make_dialog(i, a.turns, a.seed) for i in range(max(a.levels))]
    cache = SpeechCache(Path(a.speech_dir))
    t = time.perf_counter()
    made = cache.make_all(needed(dialogs))
    progress(f"speech: {made} phrases made in {time.perf_counter() - t:.1f} s "
             f"({len(needed(dialogs))} in use, cache {a.speech_dir})")
    if a.make_speech:
        return
    if a.turn_folder:
        dialogs, turns = folder_turns(dialogs, Path(a.turn_folder))
    else:
        turns = [[render(tu, d.voice, d.wpm, cache) for tu in d.turns] for d in dialogs]
    speech = [(mine, render(d.interrupt, d.voice, d.wpm, cache))
              for mine, d in zip(turns, dialogs, strict=True)]
    judge = Judge(audible_rms=32768 * 10 ** (a.audible_dbfs / 20),
                  answer_timeout_s=a.answer_timeout)
    th = thresholds(a)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "urls": a.urls, "cpus": os.cpu_count(),
        "args": {k: v for k, v in vars(a).items() if k not in ("api_key", "urls")},
        "judge": asdict(judge), "thresholds": asdict(th),
        "dialogs": [{"caller": d.index, "voice": d.voice, "wpm": d.wpm,
                     "turns": [asdict(tu) for tu in d.turns], "interrupt": d.interrupt.text,
                     "barge_turn": d.barge_turn, "barge_in_after_s": d.barge_in_after_s}
                    for d in dialogs],
        "levels": []}
    for i, n in enumerate(a.levels):
        if i:
            time.sleep(a.gap_s)  # the last level's sessions end
        progress(f"N={n}: {n} callers over {a.spread if n > 1 else 0:g} s")
        t = time.perf_counter()
        recs, rows = level(n, a, dialogs, speech, judge)
        row = summarize(n, recs, rows, th)
        row["wall_s"] = round(time.perf_counter() - t, 1)
        row["callers_detail"] = [{k: r.get(k) for k in (
            "caller", "url", "status", "refusal", "error", "offset_s", "connected_s",
            "ready_s", "ended_s", "close_code", "mic_late_ms_max")} for r in recs]
        row["per_turn"] = rows
        if a.raw:
            row["raw"] = recs
        result["levels"].append(row)
        progress(headline(row))
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if all(r["pass"] for r in result["levels"]) else 1)


if __name__ == "__main__":
    main()
