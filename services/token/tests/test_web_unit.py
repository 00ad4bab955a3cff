"""The page's pure modules (web/src/states.js, latency.js) under node's own test runner:
the lk.agent.state -> page state mapping and the latency message schema."""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO

WEB = REPO / "services" / "token" / "web"


def test_node_unit_tests_pass() -> None:
    node = shutil.which("node")
    assert node, "node (>= 18) is required for the page's unit tests"
    tests = sorted(str(p) for p in (WEB / "test").glob("*.test.js"))
    assert len(tests) >= 2
    r = subprocess.run([node, "--test", *tests], cwd=WEB, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# fail 0" in r.stdout and "# pass 0" not in r.stdout
