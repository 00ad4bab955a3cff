"""P1 decoder faults (applied to the received reply): each one FAILs the gates its case
names, and a clean reply FAILs none. Link faults run live: test_link.py, test_direct_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import received, speechlike
from voice_autortc.cases import Case, Input, load_cases
from voice_autortc.faults import apply_fault
from voice_autortc.gates import FAIL, GATES
from voice_autortc.transports.base import OK, Capture
from voice_autortc.verdict import judge_case

CASES = {c.id: c for c in load_cases()[0].cases}


def _capture(case_id: str, pre: np.ndarray) -> Capture:
    rx = received(pre.copy(), jitter_ms=3)
    return Capture(case_id=case_id, trace_id="t", status=OK, rate=rx.rate, full=pre,
                   reply=rx, pre=pre, pre_rate=rx.rate, eot=99.0, first_audible=100.0)


@pytest.mark.parametrize("level", [0.03, 0.1, 0.3])
def test_clean_link_passes_every_case_gate(level: float) -> None:
    pre = speechlike(level=level, seed=3)
    r = judge_case(CASES["endpoint_short_hello"], _capture("endpoint_short_hello", pre), GATES)
    assert [g.name for g in r.failed()] == []
    assert r.verdict == "PASS"


@pytest.mark.parametrize("case_id", ["p1_boom", "p1_speed", "p1_distort"])
@pytest.mark.parametrize("level", [0.03, 0.1, 0.3])
def test_each_fault_fails_its_gates(case_id: str, level: float) -> None:
    pre = speechlike(level=level, seed=7)
    r = judge_case(CASES[case_id], _capture(case_id, pre), GATES)
    failed = {g.name for g in r.failed()}
    assert set(CASES[case_id].expect_fail) <= failed, (case_id, failed)
    assert r.verdict == "PASS" and r.detected == CASES[case_id].expect_fail


def test_undetected_fault_fails_the_case() -> None:
    # A P1 case whose fault its gates cannot see must FAIL (the gate is toothless).
    case = Case(id="p1_weak", priority="P1", input=Input(text="x"),
                fault={"kind": "speed", "rate": 1.005}, expect_fail=["speed_drift"])
    r = judge_case(case, _capture("p1_weak", speechlike()), GATES)
    assert r.verdict == FAIL and r.detected == []


def test_faults_are_deterministic() -> None:
    pre = speechlike()
    for kind in ("boom", "speed", "distort"):
        f = CASES[f"p1_{kind}"].fault
        a, b = apply_fault(received(pre), f), apply_fault(received(pre), f)
        assert np.array_equal(a.audio, b.audio) and a.arrivals == b.arrivals
