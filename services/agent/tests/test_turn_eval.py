"""bench/turn_eval.py on a tiny espeak-ng turn folder: the JSON's shape, the wait rule on
real speech through the real ear (Moonshine) and the word rule, and folder errors."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if importlib.util.find_spec("bench") is None:  # plain `pytest`; CI's `python -m pytest`
    sys.path.insert(0, str(REPO))             # runs from the root, which has it

from bench.turn_eval import evaluate, main  # noqa: E402
from bench.turn_folder import FolderError, Turn, read_folder, speech_end_s, write_turn  # noqa: E402
from bench.turn_set import Plan, make, plan  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng (services/agent/setup.sh test)")

HANGOVER = 0.2
TURNS = [  # (id, label, kind, text, pause)
    ("q-with", "complete", "wh-preposition", "Who did you go with?", None),
    ("st", "complete", "statement", "My flight lands at noon tomorrow.", None),
    ("to", "unfinished", "after-to", "Can you tell me how to get to | the nearest pharmacy?",
     0.6),
    ("the", "unfinished", "after-the", "Please turn up the | heating in the bedroom.", 0.5),
    ("bc", "backchannel", "backchannel", "Yeah.", None),
    ("nz", "noise", "burst", "", None),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("turns")
    for i, (tid, label, kind, text, pause) in enumerate(TURNS):
        family = "noise" if label == "noise" else "espeak-ng"
        turn, pcm = make(Plan(tid, label, kind, family, "en-us", 175.0, text, pause, i))
        write_turn(out, turn, pcm)
    return out


@pytest.fixture(scope="module")
def result(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("eval") / "result.json"
    evaluate(folder, out, ["vad", "text"], [0.1, 0.3], max_delay=1.0, hangover_s=HANGOVER,
             jobs=1)
    return json.loads(out.read_text())  # what was written, not the object in memory


def test_the_set_locates_the_pause_from_the_audio(folder: Path) -> None:
    turns = {t.id: t for t in read_folder(folder)}
    assert turns["to"].resume_s - turns["to"].stop_s == pytest.approx(0.6, abs=0.011)
    assert turns["the"].resume_s - turns["the"].stop_s == pytest.approx(0.5, abs=0.011)
    assert turns["q-with"].resume_s is None and 0.8 < turns["q-with"].stop_s < 2.5
    assert all(t.source == "synthetic" for t in turns.values())


def test_json_shape(result: dict) -> None:
    assert result["source"] == "synthetic"
    assert result["conditions"]["detectors"] == ["vad", "text"]
    assert result["conditions"]["vad_silence_s"] == HANGOVER
    assert set(result["summary"]) == {"vad", "text"}
    s = result["summary"]["text"]["0.1"]
    assert s["source"] == "synthetic"
    assert set(s) == {"source", "cutoff", "cut_inside", "latency", "held", "long_holds",
                      "backchannel", "noise"}
    assert s["cutoff"]["n"] == 2 and set(s["cutoff"]["by_kind"]) == {"after-to", "after-the"}
    assert set(s["latency"]) >= {"p50_ms", "p95_ms", "max_ms", "n", "by_family", "by_kind"}
    assert s["backchannel"]["n"] == 1 and s["noise"]["n"] == 1
    assert {r["id"] for r in result["turns"]} == {t[0] for t in TURNS}
    assert all(set(r["p_end"]) == {"vad", "text"} for r in result["turns"])


def test_vad_cuts_the_pause_after_to_and_the_word_rule_holds_it(result: dict) -> None:
    row = next(r for r in result["turns"] if r["id"] == "to")
    assert row["transcript"].lower().rstrip(" .?").endswith("get to"), row["transcript"]
    assert row["p_end"]["vad"] == 1.0 and row["p_end"]["text"] < 0.5
    vad, text = result["summary"]["vad"]["0.1"], result["summary"]["text"]["0.1"]
    assert vad["cutoff"]["by_kind"]["after-to"]["cut"] == 1
    assert text["cutoff"]["by_kind"]["after-to"]["cut"] == 0


def test_complete_turns_wait_the_min_delay_or_the_hangover(result: dict) -> None:
    for m, expect_ms in (("0.1", HANGOVER * 1e3), ("0.3", 300)):
        lat = result["summary"]["text"][m]["latency"]
        assert lat["n"] == 2 and lat["max_ms"] == pytest.approx(expect_ms), lat
        assert result["summary"]["text"][m]["long_holds"]["count"] == 0
        assert result["summary"]["text"][m]["held"]["count"] == 0


def test_a_bad_json_or_a_wav_without_one_is_named(folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "st.json").write_text("{not json")
    with pytest.raises(FolderError, match=r"st\.json"):
        read_folder(bad)
    with pytest.raises(SystemExit, match=r"st\.json"):
        main([str(bad), "--detectors", "vad", "--out", str(tmp_path / "r.json")])
    (bad / "st.json").unlink()
    with pytest.raises(FolderError, match=r"st\.wav: no st\.json"):
        read_folder(bad)
    (bad / "st.wav").unlink()
    meta = json.loads((bad / "bc.json").read_text())
    (bad / "bc.json").write_text(json.dumps({**meta, "label": "maybe"}))
    with pytest.raises(FolderError, match=r"bc\.json: label 'maybe'"):
        read_folder(bad)


def test_the_plan_is_deterministic_and_balanced() -> None:
    a, b = plan(400, seed=3), plan(400, seed=3)
    assert a == b and a != plan(400, seed=4)
    speech = [p for p in a if p.family != "noise"]
    for label in ("complete", "unfinished", "backchannel"):
        fams = [p.family for p in speech if p.label == label]
        assert fams.count("espeak-ng") == fams.count("flite") > 0
    assert all(0.3 <= p.pause_s <= 0.9 for p in a if p.label == "unfinished")


def test_the_page_feedback_recorder_writes_turns_this_reads(tmp_path: Path) -> None:
    import numpy as np
    from voice_agent.conversation.turn_end import Decision
    from voice_agent.feedback import FeedbackRecorder

    audio = np.zeros(16000, np.float32)
    audio[:8000] = 0.1 * np.sin(np.arange(8000) / 5)
    rec = FeedbackRecorder(tmp_path, max_mb=10)
    for label in ("unfinished", "complete"):
        rec.save_sync(Decision(detector="text", transcript="how do I get to", p_end=0.9,
                               wait_s=0.3, at=0.0, audio=audio, stop_s=0.5), label, "s1")
    turns = read_folder(tmp_path)
    assert sorted(t.label for t in turns) == ["complete", "unfinished"]
    assert all(t.source == "feedback" and t.stop_s == 0.5 and t.resume_s is None
               and t.decision["detector"] == "text" for t in turns)


def test_the_harness_waits_as_the_agent_does_for_a_short_turn() -> None:
    """A complete turn of a word or two waits the agent's short-turn delay (the hangover
    and min delay otherwise); a held turn the max delay."""
    from bench.turn_report import wait_s

    short = (2, 0.35)
    assert wait_s(0.9, 0.2, 1.0, 0.2, "Hello.", short) == 0.35
    assert wait_s(0.9, 0.2, 1.0, 0.2, "Yes, please.", short) == 0.35
    assert wait_s(0.9, 0.2, 1.0, 0.2, "What is the weather like?", short) == 0.2
    assert wait_s(0.05, 0.2, 1.0, 0.2, "Hello,", short) == 1.0
    assert wait_s(0.9, 0.5, 1.0, 0.2, "Hello.", short) == 0.5  # the min delay is longer
    assert wait_s(0.9, 0.2, 1.0, 0.2, "Hello.") == 0.2  # off


def test_the_sweeps_callers_make_a_folder_the_harness_reads(tmp_path: Path) -> None:
    """`--from-dialogs`: each paused turn's pause an unfinished turn (resumed where its
    second phrase starts), every question and each paused turn's end a complete one; the
    ear's end probability is in the result, and the doubt setting is applied."""
    from bench.turn_set import from_dialogs

    folder = tmp_path / "dialogs"
    made = from_dialogs(folder, 2, 0, tmp_path / "speech")
    turns = read_folder(folder)
    assert len(turns) == len(made) and {t.label for t in turns} == {"complete", "unfinished"}
    for t in turns:
        if t.label == "unfinished":
            assert t.resume_s is not None and 0.4 <= t.resume_s - t.stop_s <= 0.71, t
    out = tmp_path / "eval.json"
    evaluate(folder, out, ["text"], [0.2], jobs=1, ear=(1.0, 0.0))  # every word doubted
    r = json.loads(out.read_text())
    assert r["conditions"]["ear_doubt"] == {"min_end": 1.0, "min_last": 0.0}
    assert all(t["ear"]["p_end"] is not None for t in r["turns"] if t["transcript"])
    doubted = [t for t in r["turns"] if t["transcript"] and t["ear"]["p_end"] < 1.0]
    assert doubted and all(t["p_end"]["text"] < 0.5 for t in doubted)


def test_a_pause_inside_a_turns_speech_is_judged_too(tmp_path: Path) -> None:
    """A complete turn whose speech holds a silence longer than the hangover: the VAD ends
    speech there too, and the harness judges the words up to it. Silence alone cuts both
    turns inside; the word rule holds the pause after "to", not the one after a clause
    that could end. A pause the folder labels as its own turn (`pause_s`) is not judged
    again inside the complete one."""
    folder = tmp_path / "inner"
    folder.mkdir()
    for i, (tid, text) in enumerate((
            ("to", "Can you tell me how to get to | the nearest pharmacy?"),
            ("room", "I need a hotel room | with a view of the sea."))):
        turn, pcm = make(Plan(tid, "unfinished", "x", "espeak-ng", "en-us", 175.0, text, 0.5, i))
        pause = [turn.stop_s, turn.resume_s]
        whole = Turn(id=f"{tid}-whole", audio=f"{tid}-whole.wav", label="complete",
                     stop_s=speech_end_s(pcm), resume_s=None, text=turn.text, kind="x",
                     family="espeak-ng", source="synthetic")
        write_turn(folder, whole, pcm)
        labelled = Turn(**{**whole.__dict__, "id": f"{tid}-labelled",
                           "audio": f"{tid}-labelled.wav", "extra": {"pause_s": pause}})
        write_turn(folder, labelled, pcm)
    out = tmp_path / "eval.json"
    evaluate(folder, out, ["vad", "text"], [0.2], hangover_s=HANGOVER, jobs=1)
    r = json.loads(out.read_text())
    rows = {t["id"]: t for t in r["turns"]}
    for tid in ("to", "room"):
        (gap,) = rows[f"{tid}-whole"]["inner"]
        assert gap["gap_s"] == pytest.approx(0.5, abs=0.03) and gap["p_end"]["vad"] == 1.0
        assert rows[f"{tid}-labelled"]["inner"] == []
    assert rows["to-whole"]["inner"][0]["p_end"]["text"] < 0.5
    assert rows["room-whole"]["inner"][0]["p_end"]["text"] >= 0.5, rows["room-whole"]
    inside = r["summary"]
    assert inside["vad"]["0.2"]["cut_inside"]["cut"] == 2
    assert inside["text"]["0.2"]["cut_inside"]["cut"] == 1
    assert inside["text"]["0.2"]["cut_inside"]["n"] == 4
