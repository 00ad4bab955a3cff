"""The `livekit` transport: user_bot + probe_bot in a real LiveKit room with the agent.

Per case (seed 003 11.1 and 14.x): a fresh room `<prefix>-<case>-<trace[-6:]>` (the
agent is dispatched by the prefix; per-case rooms keep a stale agent out), the probe
joins first, then the user; the user waits for probe_ready + agent_ready, speaks,
optionally barges in, and the probe records until reply_end (or the clip's length
plus `record_pad_s`). pre-RTC comes from the agent's `<pre_rtc_dir>/<trace>/pre_rtc.wav`
when it writes one (matched by the agent trace id in its marks / latency report).

NOT RUN in this repository's CI: no LiveKit server binary installs on these machines.
Its pure parts (protocol, slicing, token minting) are unit-tested.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ..audio import read_wav
from ..cases import Case
from ..probe_bot import ProbeBot, slice_reply
from ..settings import AutoRTCSettings
from ..speech import UserClip
from ..user_bot import UserBot, mint_token
from .base import ERROR, NO_REPLY, OK, POST_SILENT, PRE_MISSING, Capture

READY_TIMEOUT_S = 20.0


def room_name(prefix: str, case_id: str, trace_id: str) -> str:
    return f"{prefix}-{case_id}-{trace_id[-6:]}"


def find_pre_rtc(pre_rtc_dir: str, trace_ids: list[str]) -> Path | None:
    if not pre_rtc_dir:
        return None
    for tid in trace_ids:
        p = Path(pre_rtc_dir) / tid / "pre_rtc.wav"
        if p.is_file():
            return p
    return None


async def run_case(case: Case, clip: UserClip, *, settings: AutoRTCSettings, trace_id: str,
                   barge_clip: UserClip | None = None) -> Capture:
    s = settings
    room = room_name(s.room_prefix, case.id, trace_id)
    user_id, probe_id = f"user-bot-{trace_id[-6:]}", f"probe-bot-{trace_id[-6:]}"
    cap = Capture(case_id=case.id, trace_id=trace_id, rate=48000)
    probe, user = ProbeBot(trace_id, case.id, user_id), UserBot(trace_id, case.id)
    try:
        await probe.connect(s.livekit_url, mint_token(s.livekit_api_key, s.livekit_api_secret,
                                                      room=room, identity=probe_id))
        await user.connect(s.livekit_url, mint_token(s.livekit_api_key, s.livekit_api_secret,
                                                     room=room, identity=user_id))
        missing = await user.wait_ready(READY_TIMEOUT_S)
        if "probe_ready" in missing:
            raise TimeoutError(f"no agent audio track within {READY_TIMEOUT_S:.0f} s "
                               f"(is the agent dispatched to rooms '{s.room_prefix}-*'?)")
        if missing:
            cap.notes.append("agent_ready missing: the agent does not speak the AutoRTC "
                             "protocol; slicing falls back to energy")
        _start, cap.eot = await user.speak(clip)
        if barge_clip is not None and case.input.barge_in is not None:
            await _barge(user, probe, cap, case, barge_clip)
        wait = case.expect.reply_timeout_s if not missing else clip.duration_s + s.record_pad_s
        try:
            async with asyncio.timeout(wait):
                await probe.reply_end.wait()
        except TimeoutError:
            if not missing:
                cap.notes.append(f"no reply_end within {wait:.0f} s")
    except Exception as e:
        cap.status, cap.error = ERROR, f"{type(e).__name__}: {e}"
    finally:
        await asyncio.gather(user.aclose(), probe.aclose(), return_exceptions=True)
    if cap.status == ERROR:
        return cap
    return finish(cap, probe, s)


async def _barge(user: UserBot, probe: ProbeBot, cap: Capture, case: Case,
                 barge_clip: UserClip) -> None:
    assert case.input.barge_in is not None
    deadline = time.perf_counter() + case.expect.reply_timeout_s
    eot = cap.eot or 0.0
    while time.perf_counter() < deadline:
        if any(t >= eot for t in probe.rec.arrivals):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(case.input.barge_in.after_reply_ms / 1000)
    t0, _ = await user.speak(barge_clip)
    cap.barge_in = {"barge_in_at": t0}


def finish(cap: Capture, probe: ProbeBot, s: AutoRTCSettings) -> Capture:
    """Slice the probe's recording and classify the capture (pure; unit-tested)."""
    cap.full = probe.rec.audio()
    cap.agent_turns = list(probe.latency)
    reply, cap.slicing, cap.reply_start, cap.reply_end = slice_reply(probe.rec, probe.marks,
                                                                     cap.eot)
    cap.reply = reply
    if reply is None:
        cap.status = NO_REPLY
        return cap
    loud = [t for f, t in zip(probe.rec.frames, probe.rec.arrivals, strict=True)
            if (cap.reply_start or 0) <= t and len(f) and
            float((f**2).mean()) ** 0.5 >= 10 ** (-50 / 20)]
    cap.first_audible = loud[0] if loud else None
    rms = float((reply.audio**2).mean()) ** 0.5 if len(reply.audio) else 0.0
    tids = [*probe.marks.agent_trace_ids,
            *[str(m["trace_id"]) for m in probe.latency if "trace_id" in m]]
    pre = find_pre_rtc(s.pre_rtc_dir, tids)
    if pre is not None:
        cap.pre, cap.pre_rate = read_wav(pre)
    if rms < s.valid_rms:
        cap.status = POST_SILENT
    elif cap.pre is None:
        cap.status = PRE_MISSING
    else:
        cap.status = OK
    return cap
