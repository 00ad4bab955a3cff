"""run_suite's command line: --help, and every bad input exits 2 with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from voice_autortc.run_suite import main


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--transport", "--quick", "--nightly", "--compare", "--gate",
                 "--spawn-backends"):
        assert flag in out


@pytest.mark.parametrize(("args", "msg"), [
    (["--gate", "max_gap"], "name=number"),
    (["--gate", "nope=1"], "unknown gate"),
    (["--case", "nope"], "no such case"),
    (["--compare", "/nonexistent/run"], "no report.json"),
])
def test_bad_arguments(args: list[str], msg: str, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--output-root", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran, no run directory


def test_bad_case_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"cases": [{"id": "a", "priority": "P1", "input": {"text": "x"},
                                        "fault": {"kind": "boom"},
                                        "expect_fail": ["no_such_gate"]}]}))
    assert main(["--cases", str(p), "--output-root", str(tmp_path / "o")]) == 2
    assert "unknown gates" in capsys.readouterr().err


def test_livekit_needs_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    for k in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"):
        monkeypatch.delenv(k, raising=False)
    assert main(["--transport", "livekit", "--output-root", str(tmp_path)]) == 2
    assert "LIVEKIT_URL" in capsys.readouterr().err
