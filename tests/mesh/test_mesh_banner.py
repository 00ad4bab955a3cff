"""The RANDOM WEIGHTS banner `make up` prints: a closed frame, every row as wide as the top."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "local"))
from mesh import BANNER, _box


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def test_every_row_of_the_banner_ends_at_the_same_column() -> None:
    rows = BANNER.splitlines()
    assert len({columns(r) for r in rows}) == 1, "\n" + BANNER
    assert rows[0].strip()[0] + rows[0][-1] == "┌┐" and rows[-1].strip()[0] + rows[-1][-1] == "└┘"
    assert all(r.strip()[0] == "│" and r[-1] == "│" for r in rows[1:-1])
    assert "RANDOM WEIGHTS" in rows[1]


def test_the_frame_grows_with_its_longest_line() -> None:
    rows = _box(["short", "a longer line"]).splitlines()
    assert rows[1] == "  │ short         │" and len({len(r) for r in rows}) == 1
