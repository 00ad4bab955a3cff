"""The progress display: one grep-able line per finished case, or a live bar on a TTY."""

from __future__ import annotations

import pytest
from voice_autortc.progress import SuiteProgress


def test_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with SuiteProgress(2, live=False) as p:
        p.start_case("a")
        p.end_case("a", "PASS", "OK", "eot→audio=500 ms")
        p.start_case("b", attempt=2)
        p.end_case("b", "FAIL", "NO_REPLY", "")
    err = capsys.readouterr().err
    done = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert done[0].startswith("[1/2] a: PASS capture=OK eot→audio=500 ms")
    assert done[1].startswith("[2/2] b: FAIL capture=NO_REPLY")
    assert "b (retry 1) · pass 1 fail 0" in err
    assert (p.passed, p.failed) == (1, 1)


def test_live_bar_runs() -> None:
    with SuiteProgress(1, live=True) as p:
        p.start_case("a")
        p.end_case("a", "PASS", "OK", "")
    assert p.done == 1
