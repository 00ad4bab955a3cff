"""The page's pure modules (web/src/states.js, latency.js, turns.js, ...) under node's own
test runner: the lk.agent.state -> page state mapping, the latency message schema, the
turn list; and the page's babble rule checked against demo-chat's."""

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


def _demo_chat_readable(text: str) -> str:
    """demo-chat's rule (voice_tts.client.__main__._readable, another service's venv):
    replacement and non-printable characters as ·, newlines kept."""
    return "".join(c if (c.isprintable() and c != "\ufffd") or c == "\n" else "·"
                   for c in text)


def test_page_prints_babble_as_demo_chat_does() -> None:
    """turns.js readable() against demo-chat's rule, character by character over the whole
    BMP (lone surrogates included) and a sample of the astral planes. Python's Unicode
    data may be older than node's: a character unassigned for Python (·) may be a letter
    for node; only those may differ."""
    import json
    import unicodedata

    node = shutil.which("node")
    assert node
    chars = [chr(c) for c in range(0x10000)] + [chr(c) for c in range(0x10000, 0x110000, 97)]
    script = ("import('./src/turns.js').then(({ readable }) => {"
              " const cs = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              " process.stdout.write(JSON.stringify(cs.map(readable))); });")
    r = subprocess.run([node, "-e", script], cwd=WEB, input=json.dumps(chars),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    differ = [f"U+{ord(c):04X} {unicodedata.category(c)}: page {s!r}, demo-chat "
              f"{_demo_chat_readable(c)!r}" for c, s in zip(chars, shown, strict=True)
              if s != _demo_chat_readable(c) and unicodedata.category(c) != "Cn"]
    assert differ == [], f"{len(differ)} characters differ, e.g. {differ[:10]}"
    assert shown[0xFFFD] == shown[0x01] == "·" and shown[ord("\n")] == "\n"
