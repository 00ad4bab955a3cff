"""Gates: thresholds from the seed, overridable, and SKIP never counts as PASS."""

from __future__ import annotations

import pytest
from conftest import received, speechlike
from voice_autortc.cases import load_cases
from voice_autortc.gates import FAIL, GATES, PASS, SKIP, configure, evaluate, parse_overrides
from voice_autortc.transports.base import NO_REPLY, OK, Capture
from voice_autortc.verdict import judge_case, judge_suite

CASES = {c.id: c for c in load_cases()[0].cases}


def test_seed_thresholds_are_the_defaults() -> None:
    t = {g.name: (g.op, g.threshold) for g in GATES}
    assert t["eot_to_first_audio_p95"] == ("<=", 650)
    assert t["tts_first_to_publish_p95"] == ("<=", 120)
    assert t["audible_dropouts"] == ("==", 0)
    assert t["max_gap"] == ("<", 350)
    assert t["clipping_ratio"] == ("<", 0.001)
    assert t["llm_ttft_p95"] == ("<=", 80)
    assert t["p0_valid_rate"] == (">=", 1.0)
    assert t["inter_arrival_p95"] == ("<=", 30)
    assert t["kpi_regression"] == ("<=", 30)
    assert all(g.fix for g in GATES)  # every gate names a Suggested Fix


def test_overrides() -> None:
    g = {x.name: x for x in configure(parse_overrides(["max_gap=200", "llm_ttft_p95=1e3"]))}
    assert g["max_gap"].threshold == 200 and g["llm_ttft_p95"].threshold == 1000
    assert g["max_gap"].check(250) == FAIL and g["max_gap"].check(150) == PASS
    with pytest.raises(ValueError, match="unknown gate"):
        configure({"max_gapp": 1})
    with pytest.raises(ValueError, match="name=number"):
        parse_overrides(["max_gap"])
    with pytest.raises(ValueError, match="name=number"):
        parse_overrides(["max_gap=big"])


def test_unmeasured_is_skip() -> None:
    res = {r.name: r.status for r in evaluate(GATES, "suite", {"llm_ttft_p95_ms": None})}
    assert res["llm_ttft_p95"] == SKIP
    # A negative KPI regression is an improvement, not "unmeasured".
    res = {r.name: r.status for r in evaluate(GATES, "suite", {"kpi_regression_ms": -12.0})}
    assert res["kpi_regression"] == PASS
    # Nor is a negative HF drop (the reply came out a little brighter than it went in).
    res = {r.name: r.status for r in evaluate(GATES, "case", {"hf_ratio_drop_db": -0.02})}
    assert res["hf_ratio_drop"] == PASS
    res = {r.name: r.status for r in evaluate(GATES, "case", {"inter_arrival_max_ms": -1.0})}
    assert res["inter_arrival_max"] == SKIP


def _ok_capture(case_id: str, eot_ms: float) -> Capture:
    pre = speechlike(seed=5)
    rx = received(pre.copy())
    return Capture(case_id=case_id, trace_id="t", status=OK, rate=rx.rate, full=pre, reply=rx,
                   pre=pre, pre_rate=rx.rate, eot=100.0, first_audible=100.0 + eot_ms / 1000,
                   agent_turns=[{"llm_ttft_ms": 40.0, "tts_first_to_publish_ms": 1.0}],
                   transcript=[{"role": "user", "text": CASES[case_id].input.text or ""}])


def test_suite_verdict_and_kpi_regression() -> None:
    case = CASES["endpoint_short_hello"]
    results = [judge_case(case, _ok_capture(case.id, ms), GATES) for ms in (300, 400, 500)]
    verdict, agg, sg = judge_suite(results, GATES)
    assert verdict == PASS and agg["p0_valid_rate"] == 1.0
    assert agg["eot_to_first_audio_p95_ms"] == pytest.approx(490, abs=1)
    st = {g.name: g.status for g in sg}
    assert st["kpi_regression"] == SKIP and st["eot_to_first_audio_p95"] == PASS
    verdict, agg, sg = judge_suite(results, GATES, baseline_kpi=440.0)  # 50 ms worse
    assert agg["kpi_regression_ms"] == pytest.approx(50, abs=1)
    assert verdict == FAIL and {g.name: g.status for g in sg}["kpi_regression"] == FAIL


def test_no_reply_fails_p0_and_valid_rate() -> None:
    case = CASES["endpoint_short_hello"]
    bad = judge_case(case, Capture(case_id=case.id, trace_id="t", status=NO_REPLY), GATES)
    assert bad.verdict == FAIL
    assert {g.name: g.status for g in bad.gates}["audio_valid"] == FAIL
    assert {g.name: g.status for g in bad.gates}["max_gap"] == SKIP
    good = judge_case(case, _ok_capture(case.id, 300), GATES)
    verdict, agg, _ = judge_suite([good, bad], GATES)
    assert verdict == FAIL and agg["p0_valid_rate"] == 0.5


def _turn(case_id: str, **times: float | None) -> Capture:
    cap = _ok_capture(case_id, 400)
    cap.user_speech_start = 98.0  # the user spoke 98.0 .. 100.0 (EoT)
    for k, v in times.items():
        setattr(cap, k, v)
    return cap


def test_early_reply_measures_agent_audio_before_the_eot() -> None:
    case = CASES["endpoint_short_hello"]
    waited = judge_case(case, _turn(case.id), GATES)
    assert waited.metrics["early_reply_ms"] == 0.0 and waited.verdict == PASS
    early = judge_case(case, _turn(case.id, agent_audio_during_user=99.2), GATES)
    assert early.metrics["early_reply_ms"] == pytest.approx(800)
    assert {g.name: g.status for g in early.gates}["early_reply"] == FAIL
    assert early.verdict == FAIL


def test_the_suite_counts_false_cutoffs() -> None:
    case = CASES["endpoint_short_hello"]
    turns = [_turn(case.id), _turn(case.id, agent_audio_during_user=99.5), _turn(case.id),
             _turn(case.id, agent_audio_during_user=99.9)]
    agg = judge_suite([judge_case(case, t, GATES) for t in turns], GATES)[1]
    assert (agg["false_cutoffs"], agg["false_cutoff_rate"]) == (2.0, 0.5)
    agg = judge_suite([judge_case(case, _ok_capture(case.id, 300), GATES)], GATES)[1]
    assert agg["false_cutoff_rate"] is None  # no user speech onset: not measured


def test_xfail_case_reports_but_does_not_fail_the_suite() -> None:
    case = CASES["stutter_long_pause"].model_copy(update={"xfail": "a known issue"})
    bad = judge_case(case, _turn(case.id, agent_audio_during_user=99.0), GATES)
    good = judge_case(case, _turn(case.id), GATES)
    assert (bad.verdict, good.verdict) == ("XFAIL", "XPASS")
    assert [g.name for g in bad.failed()] == ["early_reply"]  # the gate itself still fails
    assert judge_suite([bad], GATES)[0] == PASS


def test_barge_in_cut_times_onset_to_last_audible() -> None:
    case = CASES["interrupt_once"]
    cut = judge_case(case, _turn(case.id, barge_onset=101.0, reply_last_audible=101.25),
                     GATES)
    assert cut.metrics["barge_in_to_silence_ms"] == pytest.approx(250)
    assert cut.verdict == PASS
    on = judge_case(case, _turn(case.id, barge_onset=101.0, reply_last_audible=104.0), GATES)
    assert {g.name: g.status for g in on.gates}["barge_in_cut"] == FAIL
    # A reply over before the barge-in (or no barge-in) proves nothing: FAIL, not SKIP.
    none = judge_case(case, _turn(case.id, barge_onset=101.0, reply_last_audible=100.5),
                      GATES)
    assert {g.name: g.status for g in none.gates}["barge_in_cut"] == FAIL


def test_a_backchannel_case_needs_a_pause_and_the_whole_reply() -> None:
    case = CASES["backchannel_once"]

    def gates(r: object) -> dict[str, str]:
        return {g.name: g.status for g in r.gates}  # type: ignore[attr-defined]

    resumed = judge_case(case, _turn(case.id, barge_onset=101.0, reply_unplayed_ms=0.0,
                                     reply_pause_ms=620.0, reply_after_barge_ms=2400.0),
                         GATES)
    assert resumed.verdict == PASS and "barge_in_cut" not in resumed.metrics
    assert gates(resumed)["max_gap"] == "SKIP"  # the pause is deliberate
    cut = judge_case(case, _turn(case.id, barge_onset=101.0, reply_unplayed_ms=30.0,
                                 reply_pause_ms=0.0, reply_after_barge_ms=0.0), GATES)
    assert gates(cut)["backchannel_resumed"] == FAIL and cut.verdict == FAIL
    played_on = judge_case(case, _turn(case.id, barge_onset=101.0, reply_unplayed_ms=0.0,
                                       reply_pause_ms=20.0, reply_after_barge_ms=2400.0),
                           GATES)
    assert gates(played_on)["backchannel_paused"] == FAIL
    dropped = judge_case(case, _turn(case.id, barge_onset=101.0, reply_unplayed_ms=600.0,
                                     reply_pause_ms=620.0, reply_after_barge_ms=1800.0),
                         GATES)
    assert gates(dropped)["backchannel_lossless"] == FAIL
    # not measured (no reply to speak over): no proof, FAIL
    none = judge_case(case, _turn(case.id), GATES)
    assert {gates(none)[g] for g in ("backchannel_resumed", "backchannel_lossless",
                                     "backchannel_paused")} == {FAIL}
    # an interruption case is not judged by the backchannel gates
    assert gates(judge_case(CASES["interrupt_once"], _turn(
        "interrupt_once", barge_onset=101.0, reply_last_audible=101.2), GATES))[
        "backchannel_resumed"] == "SKIP"


def test_word_error_rate() -> None:
    from voice_autortc.transcripts import heard, wer

    assert wer("Hello there.", "hello there") == 0.0
    assert wer("I would like to <break time=\"600ms\"/> book a table.",
               "i would like to book the table") == pytest.approx(1 / 7)
    assert wer("What time is it now?", "") == 1.0  # nothing heard: every word deleted
    assert wer("Hi.", "hi hi hi") == 2.0  # insertions count
    chat = [{"role": "assistant", "text": "Hi."}, {"role": "user", "text": "what now"},
            {"role": "user", "text": "please"}]
    assert heard(chat) == "what now please"


def test_stt_wer_gate_fails_when_the_agent_hears_nothing() -> None:
    case = CASES["endpoint_short_hello"]  # "Hello there."

    def run(user_text: str) -> str:
        cap = _ok_capture(case.id, 300)
        cap.transcript = [{"role": "user", "text": user_text}]
        _, _, sg = judge_suite([judge_case(case, cap, GATES)], GATES)
        return {g.name: g.status for g in sg}["stt_wer"]

    assert run("hello there") == PASS
    assert run("oh there") == PASS  # one word of two wrong: 0.5
    assert run("[untranscribed speech, 1.2 s]") == FAIL  # the placeholder: nothing heard
