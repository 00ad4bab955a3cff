"""The case file: what each test case says, what the agent must do, which gates apply.

A case file is JSON (the seed's `cases/all_cases.json`; the default one ships inside
the package). Each case has an input utterance (espeak-ng text, or a supplied WAV),
an expectation, and for P1 cases a live link impairment (`link`) or a decoder fault
applied to the received reply (`fault`), plus the gates that fault MUST fail. `xfail`
marks a known issue (reported, never failing the suite). The model is strict (unknown keys are
errors): a typo in a threshold name must not silently run with the default.

This module knows nothing about transports or metrics; it only parses and checks.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

FaultKind = Literal["boom", "speed", "distort"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BargeIn(_Strict):
    # A second utterance the user bot speaks while the agent is replying.
    text: str = Field(min_length=1)
    # When to start it, counted from the reply's first audible frame at the probe.
    after_reply_ms: int = Field(800, ge=0, le=30_000)
    # "cut": an interruption, the reply must stop (barge_in_cut). "resume": a backchannel
    # ("yeah"), the reply pauses and plays on from where it paused (backchannel_* gates).
    expect: Literal["cut", "resume"] = "cut"


class Input(_Strict):
    # Text spoken by espeak-ng (SSML allowed: <break time="600ms"/> makes a pause).
    text: str | None = None
    # Or a supplied WAV (path relative to the case file); 16-bit PCM mono.
    wav: str | None = None
    voice: str = "en-us"  # espeak-ng voice (e.g. en-us, cmn)
    speed_wpm: int = Field(165, ge=60, le=450)
    gain_db: float = Field(-6.0, ge=-60.0, le=0.0)  # peak level of the speech
    noise_snr_db: float | None = Field(None, ge=-10.0, le=60.0)  # added pink-ish noise
    lead_silence_ms: int = Field(300, ge=0, le=10_000)
    # Silence after the speech: the VAD needs it to see the end of turn.
    tail_silence_ms: int = Field(1000, ge=0, le=30_000)
    barge_in: BargeIn | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Input:
        if (self.text is None) == (self.wav is None):
            raise ValueError("input needs exactly one of `text` (espeak-ng) or `wav`")
        return self


class Expect(_Strict):
    reply: bool = True  # the agent must answer with audible speech
    min_reply_ms: int = Field(200, ge=0)  # shorter replies count as not valid
    # How long to wait for the reply to end (after EoT) before the capture gives up.
    reply_timeout_s: float = Field(45.0, gt=0, le=600)


class Fault(_Strict):
    """A broken decoder/codec, applied by the probe to the reply it received after the
    run (see faults.py). Network faults the session lives through are `link`."""

    kind: FaultKind
    # boom: clicks at full scale; speed: playback rate; distort: drive + lowpass.
    clicks: int = Field(3, ge=1, le=100)
    click_ms: float = Field(8.0, gt=0, le=200)
    rate: float = Field(1.12, gt=0.25, lt=4.0)
    drive_db: float = Field(12.0, ge=0, le=60)  # over the peak
    lowpass_hz: float = Field(2500.0, gt=100, le=24_000)


class Link(_Strict):
    """The network between the agent's output and the listener, impaired live while the
    session plays (link.py; direct transport). Applies from the user's turn on."""

    loss_pct: float = Field(0.0, ge=0.0, le=90.0)  # packets lost, in bursts
    loss_burst_frames: int = Field(1, ge=1, le=50)
    jitter_ms: float = Field(0.0, ge=0.0, le=2000.0)  # delay uniform(0, jitter_ms)
    stall_ms: int = Field(0, ge=0, le=10_000)  # nothing arrives, then a burst
    stall_at_ms: int = Field(1000, ge=0, le=60_000)  # after the first packet of the turn
    prebuffer_ms: int = Field(20, ge=0, le=1000)  # the receiver's playout delay
    seed: int = 1


class Case(_Strict):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    priority: Literal["P0", "P1"]
    description: str = ""
    quick: bool = False  # part of the --quick (CI) selection
    input: Input
    expect: Expect = Expect()
    fault: Fault | None = None
    link: Link | None = None  # a live network impairment (None: a clean link)
    # Gates this case must FAIL (P1: proof that the gates can fail).
    expect_fail: list[str] = Field(default_factory=list)
    # A known issue: the case is reported (XFAIL, or XPASS once fixed) and does not
    # fail the suite. The reason says what is wrong and who is fixing it.
    xfail: str | None = Field(None, min_length=1)

    def fault_label(self) -> str:
        """What is broken, in a few words ("-" for a clean case)."""
        if self.fault is not None:
            return self.fault.kind
        if self.link is None:
            return "-"
        ln, parts = self.link, []
        if ln.stall_ms:
            parts.append(f"stall {ln.stall_ms} ms")
        if ln.loss_pct:
            parts.append(f"loss {ln.loss_pct:g} % x{ln.loss_burst_frames}")
        if ln.jitter_ms:
            parts.append(f"jitter {ln.jitter_ms:g} ms")
        return "link: " + (", ".join(parts) or "clean")

    @model_validator(mode="after")
    def _p1_has_fault(self) -> Case:
        broken = self.fault is not None or self.link is not None
        if self.priority == "P1" and (not broken or not self.expect_fail):
            raise ValueError(f"case {self.id}: a P1 case needs a `fault` or `link`, and "
                             "`expect_fail`")
        if self.priority == "P0" and broken:
            raise ValueError(f"case {self.id}: a P0 case must not have a fault or link")
        return self


class Nightly(_Strict):
    turns: int = Field(20, ge=1, le=10_000)
    cases: list[str] = Field(default_factory=list)  # P0 ids to cycle ([] = all P0)


class CaseFile(_Strict):
    version: Literal[1] = 1
    description: str = ""
    gates: dict[str, float] = Field(default_factory=dict)  # threshold overrides
    cases: list[Case] = Field(min_length=1)
    nightly: Nightly = Nightly()

    @model_validator(mode="after")
    def _unique(self) -> CaseFile:
        ids = [c.id for c in self.cases]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate case ids: {', '.join(dup)}")
        unknown = [i for i in self.nightly.cases if i not in ids]
        if unknown:
            raise ValueError(f"nightly.cases names unknown cases: {', '.join(unknown)}")
        return self

    def select(self, *, quick: bool = False, only: list[str] | None = None) -> list[Case]:
        if only:
            missing = [i for i in only if i not in {c.id for c in self.cases}]
            if missing:
                raise ValueError(f"no such case: {', '.join(missing)}")
            return [c for c in self.cases if c.id in only]
        return [c for c in self.cases if c.quick] if quick else list(self.cases)

    def nightly_turns(self, turns: int | None = None) -> list[Case]:
        """N turns cycling through the nightly P0 cases (each turn is a fresh session)."""
        pool = [c for c in self.cases if c.priority == "P0"]
        if self.nightly.cases:
            pool = [c for c in pool if c.id in self.nightly.cases]
        n = turns or self.nightly.turns
        return [pool[i % len(pool)] for i in range(n)]


DEFAULT_CASES = "all_cases.json"


def default_case_path() -> Path:
    return Path(str(resources.files("voice_autortc") / "cases" / DEFAULT_CASES))


def load_cases(path: str | Path | None = None) -> tuple[CaseFile, Path]:
    """Parse and check a case file; a bad file raises ValueError naming what to fix."""
    p = Path(path) if path else default_case_path()
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"case file not found: {p}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from None
    try:
        cf = CaseFile.model_validate(raw)
    except ValidationError as e:
        msgs = [f"  {'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ValueError(f"{p}: bad case file:\n" + "\n".join(msgs)) from None
    for c in cf.cases:
        if c.input.wav and not (p.parent / c.input.wav).is_file():
            raise ValueError(f"{p}: case {c.id}: wav not found: {p.parent / c.input.wav}")
    return cf, p
