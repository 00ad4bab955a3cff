"""What a transport hands back for one case: the probe's recording and the moments.

All times are `time.perf_counter()` seconds of this process: the user bot and the
probe live in the suite's process, so EoT and the first audible frame share a clock.
The reply is already sliced (reply_start..reply_end); faults are NOT applied here
(run_suite applies the case's fault to `reply` as the probe's broken link).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..faults import Received

# capture_status (seed 003 11.2: classify the capture before judging the audio)
OK = "OK"
NO_REPLY = "NO_REPLY"  # the agent never sent audio after the user's EoT
POST_SILENT = "POST_SILENT"  # audio frames came but carried no audible signal
PRE_MISSING = "PRE_MISSING"  # no pre-RTC audio: Ring1 cannot run
ERROR = "ERROR"  # the transport or the agent raised / timed out


@dataclass
class Capture:
    case_id: str
    trace_id: str
    status: str = OK
    error: str | None = None
    rate: int = 24000
    full: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    reply: Received | None = None  # post-RTC reply slice with frame arrival times
    pre: np.ndarray | None = None  # pre-RTC reply (what the TTS produced)
    pre_rate: int = 24000
    eot: float | None = None  # user's end of speech
    reply_start: float | None = None
    reply_end: float | None = None
    first_audible: float | None = None  # first audible reply frame at the probe
    slicing: str = "events"  # "events" (reply_start/end marks) or "energy" (fallback)
    agent_turns: list[dict[str, object]] = field(default_factory=list)
    transcript: list[dict[str, object]] = field(default_factory=list)  # role, text
    barge_in: dict[str, float] | None = None
    # direct only: was the sender behind real time (see direct._sender_lateness)
    sender: dict[str, float] = field(default_factory=dict)
    # direct only: what the link did (packets sent, dropped; lost/late at the receiver)
    link: dict[str, float] = field(default_factory=dict)
    # On the listener's clock, for the turn-taking gates (None: not measured):
    user_speech_start: float | None = None  # first sample of the user's speech
    agent_audio_during_user: float | None = None  # first agent audio before the EoT
    barge_onset: float | None = None  # first sample of the barge-in speech
    reply_last_audible: float | None = None  # end of the reply's last audible sound
    barge_end: float | None = None  # last sample of the barge-in speech
    # direct only, on barge-in: reply audio the agent took in but never played (a cut
    # drops its buffer; a paused-and-resumed reply plays it all), the longest pause in
    # the reply's playout after the barge-in began, and audible reply after it ended
    reply_unplayed_ms: float | None = None
    reply_pause_ms: float | None = None
    reply_after_barge_ms: float | None = None
    notes: list[str] = field(default_factory=list)
