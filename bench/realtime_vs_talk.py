"""End of turn -> first audio over the agent's two WebSocket doors (issue 48).

Issue 48: "end of turn -> first audio over /v1/realtime is within 10 % of /v1/talk on the
same stack". This drives one running agent (`voice-agent serve-direct`) through both
doors, alternating turn by turn (the first door of each turn alternates too) so both
see the same load and warmth; every turn is a fresh connection:

- `/v1/talk` (aiohttp): `{"type": "start", "sample_rate": 24000}`, wait for `ready`
  and for any greeting to have played (the mesh this starts has AGENT_GREETING=""),
  then binary s16le mic messages; reply frames come back paced in real time.
- `/v1/realtime` (the `openai` SDK's realtime client, GA events): wait for
  `session.created`, then `input_audio_buffer.append` (base64 pcm16); server VAD (the
  session's default) ends the turn; reply audio comes as `response.output_audio.delta`
  events, sent as made.

Both doors get the same bytes: espeak-ng questions (bench/dialogs.py's speech cache, en-us
170 wpm, trimmed to the audible span) at 24 kHz, after 300 ms of silence, in 20 ms
chunks paced by the clock, then silence until the reply. On the client's clock: the
moment the chunk with the last speech sample was handed to the socket -> the arrival of
the first reply message holding an audible sample (|s| > 300). A turn with no audible
reply within `--answer-timeout` s, or whose connection failed, is a failure.

One JSON row per door (n, failures, p50 / p95 / mean / min / max ms, nearest-rank
percentiles), the ratio realtime / talk of p50 and p95, and every turn, to `--out`.

  .venv/agent/bin/python -m bench.realtime_vs_talk --agent 127.0.0.1:8003 --turns 10
  .venv/agent/bin/python -m bench.realtime_vs_talk --start-mesh --turns 10   # own CPU mesh

Needs aiohttp and openai (the agent's venv); the pure parts (onset, statistics, rows)
import without them (bench/tests/test_realtime_vs_talk.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.dialogs import PLAIN, SpeechCache, resample, to_pcm16
from bench.stats import pct

ROOT = Path(__file__).resolve().parents[1]
SPEECH_DIR = ROOT / "bench" / "out" / "conversation_speech"
RATE = 24000  # both doors take 24 kHz s16 (the Realtime API's pcm16; a /v1/talk input rate)
CHUNK_MS = 20
CHUNK = RATE * CHUNK_MS // 1000
LEAD_S = 0.3  # silence before each question
AUDIBLE = 300  # a reply sample above this (abs) is audible
DOORS = ("talk", "realtime")
QUESTIONS = PLAIN[:5]
VOICE, WPM = "en-us", 170


def progress(msg: str) -> None:
    print(f"realtime-vs-talk: {msg}", file=sys.stderr, flush=True)


# -- pure parts ---------------------------------------------------------------------------------
def first_audible(pcm: bytes, threshold: int = AUDIBLE) -> int | None:
    """Index of the first s16le sample with |s| > threshold, or None."""
    x = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype=np.int16).astype(np.int32)
    idx = np.flatnonzero(np.abs(x) > threshold)
    return int(idx[0]) if len(idx) else None


def chunks(pcm: np.ndarray, n: int = CHUNK) -> list[bytes]:
    """int16 samples as s16le messages of n samples (the last zero-padded)."""
    data = pcm.astype(np.int16).tobytes()
    data += bytes(-len(data) % (n * 2))
    return [data[i:i + n * 2] for i in range(0, len(data), n * 2)]


def door_row(door: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """The door's row: statistics of its answered turns' EoT -> first audible audio."""
    mine = [t for t in turns if t["door"] == door]
    ms = [t["eot_to_first_audio_ms"] for t in mine if t["ok"]]

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    return {"door": door, "n": len(ms), "failures": len(mine) - len(ms),
            "p50_ms": r(pct(ms, 50)), "p95_ms": r(pct(ms, 95)),
            "mean_ms": r(sum(ms) / len(ms) if ms else None),
            "min_ms": r(min(ms, default=None)), "max_ms": r(max(ms, default=None))}


def ratio(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """realtime / talk of p50 and p95 (None where a side has no number)."""
    by = {r["door"]: r for r in rows}
    out: dict[str, float | None] = {}
    for k in ("p50_ms", "p95_ms"):
        a, b = by["realtime"][k], by["talk"][k]
        out[k.removesuffix("_ms")] = round(a / b, 3) if a is not None and b else None
    return out


def table(rows: list[dict[str, Any]], rat: dict[str, float | None]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:,.0f}" if isinstance(v, float) else str(v)

    lines = ["| door | n | failures | EoT -> first audio p50 / p95 / mean / min / max ms |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| /v1/{r['door']} | {r['n']} | {r['failures']} | "
                     + " / ".join(f(r[k]) for k in ("p50_ms", "p95_ms", "mean_ms", "min_ms",
                                                    "max_ms")) + " |")
    lines.append(f"\nrealtime / talk: p50 {rat['p50']}, p95 {rat['p95']}")
    return "\n".join(lines)


def default_out() -> Path:
    return ROOT / "bench" / "results" / f"{dt.date.today():%Y-%m-%d}-realtime-vs-talk" \
        / "rows.json"


# -- a turn -------------------------------------------------------------------------------------
class Turn:
    """One question on one door: the paced mic and the clock marks, on perf_counter."""

    def __init__(self, door: str, index: int, question: str, pcm: np.ndarray,
                 answer_timeout_s: float) -> None:
        self.door, self.index, self.question = door, index, question
        lead = np.zeros(int(RATE * LEAD_S), dtype=np.int16)
        self.msgs = chunks(np.concatenate([lead, pcm]))
        self.last_speech_msg = (len(lead) + len(pcm) - 1) // CHUNK
        self.answer_timeout_s = answer_timeout_s
        self.t_end: float | None = None  # the chunk with the last speech sample was sent
        self.t_audible: float | None = None
        self.t_any: float | None = None  # first reply audio (audible or not) after t_end
        self.early_audio = 0  # reply messages with audible audio before t_end
        self.marks: dict[str, float] = {}  # event -> arrival (first of each), s after t_end
        self.extra: dict[str, Any] = {}
        self.mic_late_max = 0.0
        self.done = asyncio.Event()

    async def mic(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        """20 ms chunks by the clock: the question, then silence until the turn is done."""
        silence = bytes(CHUNK * 2)
        start, i = time.perf_counter(), 0
        while not self.done.is_set():
            due = start + i * CHUNK_MS / 1000
            if (delay := due - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            now = time.perf_counter()
            self.mic_late_max = max(self.mic_late_max, now - due)
            if i == self.last_speech_msg:
                self.t_end = now
            await send(self.msgs[i] if i < len(self.msgs) else silence)
            i += 1

    def audio(self, pcm: bytes) -> None:
        now = time.perf_counter()
        if self.t_end is None:
            if first_audible(pcm) is not None:
                self.early_audio += 1
            return
        if self.t_any is None and len(pcm):
            self.t_any = now
        if self.t_audible is None and first_audible(pcm) is not None:
            self.t_audible = now
            self.done.set()

    def mark(self, name: str) -> None:
        if self.t_end is not None and name not in self.marks:
            self.marks[name] = round(time.perf_counter() - self.t_end, 4)

    async def wait_answer(self) -> None:
        while self.t_end is None:
            await asyncio.sleep(0.01)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), self.answer_timeout_s)

    def record(self, error: str | None = None) -> dict[str, Any]:
        ok = error is None and self.t_audible is not None and self.t_end is not None
        if error is None and not ok:
            error = f"no audible reply within {self.answer_timeout_s} s of the end of speech"

        def ms(t: float | None) -> float | None:
            return None if t is None or self.t_end is None else round((t - self.t_end) * 1e3, 1)

        return {"door": self.door, "turn": self.index, "question": self.question, "ok": ok,
                "error": error, "eot_to_first_audio_ms": ms(self.t_audible),
                "eot_to_first_reply_audio_ms": ms(self.t_any),
                "early_audible_messages": self.early_audio,
                "mic_late_ms_max": round(self.mic_late_max * 1e3, 2),
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "events_s_after_eot": self.marks, **self.extra}


async def talk_turn(http: Any, agent: str, api_key: str, turn: Turn) -> dict[str, Any]:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    mic: asyncio.Task[None] | None = None
    try:
        async with http.ws_connect(f"ws://{agent}/v1/talk", headers=headers, heartbeat=None,
                                   max_msg_size=0) as ws:
            await ws.send_json({"type": "start", "sample_rate": RATE})
            last_audio = [time.perf_counter()]
            ready = asyncio.Event()

            async def inbox() -> None:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        last_audio[0] = time.perf_counter()
                        if mic is not None:
                            turn.audio(msg.data)
                    elif msg.type == aiohttp.WSMsgType.TEXT:
                        ev = json.loads(msg.data)
                        kind = ev.get("type")
                        if kind == "ready":
                            ready.set()
                        elif kind == "error":
                            turn.extra["agent_error"] = ev
                        elif kind == "latency" and turn.t_end is not None:
                            turn.extra.setdefault("agent_latency", ev)
                        name = f"state:{ev.get('state')}" if kind == "state" else kind
                        turn.mark(str(name))

            reader = asyncio.create_task(inbox())
            try:
                await asyncio.wait_for(ready.wait(), 15)
                # a greeting plays first: start once the agent has been quiet 0.5 s
                deadline = time.perf_counter() + 30
                while time.perf_counter() - last_audio[0] < 0.5:
                    if time.perf_counter() > deadline:
                        raise TimeoutError("the greeting did not end in 30 s")
                    await asyncio.sleep(0.02)
                mic = asyncio.create_task(turn.mic(ws.send_bytes))
                await turn.wait_answer()
                turn.done.set()
                await asyncio.gather(mic, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await ws.send_json({"type": "stop"})
            finally:
                turn.done.set()
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        return turn.record()
    except (aiohttp.ClientError, OSError, TimeoutError, ConnectionError) as e:
        return turn.record(f"{type(e).__name__}: {e}"[:300])
    finally:
        turn.done.set()
        if mic is not None:
            await asyncio.gather(mic, return_exceptions=True)


async def realtime_turn(agent: str, api_key: str, turn: Turn) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://{agent}/v1", api_key=api_key or "none")
    mic: asyncio.Task[None] | None = None
    try:
        async with client.realtime.connect(model="voice-agent") as conn:
            created = asyncio.Event()

            async def inbox() -> None:
                async for ev in conn:
                    if ev.type in ("response.output_audio.delta", "response.audio.delta"):
                        turn.audio(base64.b64decode(ev.delta))
                    elif ev.type == "session.created":
                        created.set()
                    elif ev.type == "error":
                        turn.extra.setdefault("agent_errors", []).append(
                            ev.error.model_dump(exclude_none=True))
                    turn.mark(ev.type)

            async def send(data: bytes) -> None:
                await conn.input_audio_buffer.append(audio=base64.b64encode(data).decode())

            reader = asyncio.create_task(inbox())
            try:
                await asyncio.wait_for(created.wait(), 15)
                mic = asyncio.create_task(turn.mic(send))
                await turn.wait_answer()
            finally:
                turn.done.set()
                if mic is not None:
                    await asyncio.gather(mic, return_exceptions=True)
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        return turn.record()
    except (openai.OpenAIError, OSError, TimeoutError, ConnectionError) as e:
        return turn.record(f"{type(e).__name__}: {e}"[:300])
    except Exception as e:  # the websockets library's closes
        return turn.record(f"{type(e).__name__}: {e}"[:300])
    finally:
        turn.done.set()
        await client.close()


# -- the run ------------------------------------------------------------------------------------
def questions(speech_dir: Path) -> list[tuple[str, np.ndarray]]:
    """The espeak-ng questions at 24 kHz int16 (made once into the speech cache)."""
    cache = SpeechCache(speech_dir)
    cache.make_all({(q, VOICE, WPM) for q in QUESTIONS})
    out = []
    for q in QUESTIONS:
        x16 = cache.phrase(q, VOICE, WPM).astype(np.float32) / 32768.0
        out.append((q, to_pcm16(resample(x16, 16000, RATE))))
    return out


async def run(a: argparse.Namespace, agent: str) -> dict[str, Any]:
    import aiohttp

    qs = questions(Path(a.speech_dir))
    turns: list[dict[str, Any]] = []
    total = a.warmup + a.turns
    async with aiohttp.ClientSession() as http:
        for i in range(total):
            q, pcm = qs[i % len(qs)]
            order = DOORS if i % 2 == 0 else DOORS[::-1]
            for door in order:
                t = Turn(door, i - a.warmup, q, pcm, a.answer_timeout)
                rec = await (talk_turn(http, agent, a.api_key, t) if door == "talk"
                             else realtime_turn(agent, a.api_key, t))
                rec["warmup"] = i < a.warmup
                turns.append(rec)
                what = (f"{rec['eot_to_first_audio_ms']:.0f} ms" if rec["ok"]
                        else f"FAILED: {rec['error']}")
                progress(f"{'warm-up' if i < a.warmup else f'turn {i - a.warmup + 1}/{a.turns}'}"
                         f" /v1/{door:8s} {q!r}: {what}")
                await asyncio.sleep(a.gap)
    counted = [t for t in turns if not t["warmup"]]
    rows = [door_row(d, counted) for d in DOORS]
    return {"rows": rows, "ratio_realtime_over_talk": ratio(rows), "turns": turns}


def start_mesh(run_dir: Path) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    """deploy/local/mesh.py up (tts, thinker, agent: the tiny CPU stack) on free ports, no
    greeting; returns the process (its own group), the agent's host:port and the env set."""
    from voice_testkit import MESH_PORT_VARS, MeshDidNotStart
    from voice_testkit import start_mesh as launch

    env = {"MESH_SERVICES": "tts,thinker,agent", "AGENT_GREETING": "",
           # short replies: the CPU is free between turns
           "AGENT_LLM_MAX_TOKENS": os.environ.get("AGENT_LLM_MAX_TOKENS", "24")}
    try:
        proc, full = launch(ROOT, run_dir, env,
                            on_line=lambda line: progress(f"mesh: {line.rstrip()}"))
    except MeshDidNotStart as e:
        raise SystemExit(f"realtime-vs-talk: {e}") from None
    shown = {k: full[k] for k in (*MESH_PORT_VARS, "AGENT_GREETING", "AGENT_LLM_MAX_TOKENS")}
    return proc, f"127.0.0.1:{full['AGENT_HTTP_PORT']}", shown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.realtime_vs_talk", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default="127.0.0.1:8003", help="the agent's host:port "
                   "(AGENT_HTTP_PORT; default %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("AGENT_API_KEY", ""),
                   help="sent as Authorization: Bearer (default $AGENT_API_KEY)")
    p.add_argument("--turns", type=int, default=10, help="counted turns per door")
    p.add_argument("--warmup", type=int, default=1, help="turns per door run first and "
                   "left out of the rows (default %(default)s)")
    p.add_argument("--answer-timeout", type=float, default=10.0,
                   help="no audible reply this many s after the end of speech: a failure")
    p.add_argument("--gap", type=float, default=1.0, help="pause between turns, s")
    p.add_argument("--speech-dir", default=str(SPEECH_DIR), help="espeak-ng speech cache")
    p.add_argument("--start-mesh", action="store_true", help="start the tiny CPU stack "
                   "(deploy/local/mesh.py up: tts, thinker, agent on free ports, "
                   "AGENT_GREETING=\"\"; other AGENT_* env passes through) and stop it after")
    p.add_argument("--label", default="", help="a note stored in the JSON (machine, stack)")
    p.add_argument("--out", default="", help="the JSON (default bench/results/<date>-"
                   "realtime-vs-talk/rows.json)")
    a = p.parse_args(argv)
    if a.turns < 1 or a.warmup < 0:
        p.error("--turns >= 1, --warmup >= 0")
    if a.answer_timeout <= 0 or a.gap < 0:
        p.error("--answer-timeout > 0, --gap >= 0")
    if "://" in a.agent or "/" in a.agent:
        p.error(f"--agent is host:port, not a URL: {a.agent!r}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = Path(a.out) if a.out else default_out()
    mesh = None
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "label": a.label,
        "turns": a.turns, "warmup": a.warmup, "rate": RATE, "chunk_ms": CHUNK_MS,
        "audible_abs": AUDIBLE, "voice": VOICE, "wpm": WPM, "host_cpus": os.cpu_count(),
        "argv": sys.argv[1:]}
    agent = a.agent
    try:
        if a.start_mesh:
            mesh, agent, meta["mesh_env"] = start_mesh(Path(tempfile.mkdtemp(prefix="rvt-")))
        meta["agent"] = agent
        progress(f"{a.warmup} warm-up + {a.turns} turns per door against {agent}")
        res = asyncio.run(run(a, agent))
    finally:
        if mesh is not None:
            from voice_testkit import stop_mesh

            stop_mesh(mesh)
    doc = {"meta": meta, **res}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(res["rows"], res["ratio_realtime_over_talk"]))
    progress(f"wrote {out}")
    return 0 if all(r["n"] for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
