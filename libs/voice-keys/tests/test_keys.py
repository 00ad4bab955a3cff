"""The key set alone: inline and file keys, rotation by rewriting the file, a file that
goes away, the Bearer header as clients write it. Servers' tests drive the interceptor
and the HTTP checks with real clients (services/tts, services/llm, services/agent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from voice_keys import ApiKeys, bearer


def test_off_without_keys_and_on_with_either_source(tmp_path: Path) -> None:
    assert not ApiKeys("").enabled and ApiKeys("").allows(None)
    keys = ApiKeys(" a-key , ,b-key ")
    assert keys.enabled and keys.allows("a-key") and keys.allows("b-key")
    assert not keys.allows(None) and not keys.allows("") and not keys.allows("a-ke")
    empty = tmp_path / "keys"
    empty.write_text("# none yet\n")
    assert ApiKeys("", empty).enabled and not ApiKeys("", empty).allows("x")  # fails closed


def test_the_file_rotates_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("old-key\n  # a comment\n\n")
    keys = ApiKeys("inline", path)
    assert keys.allows("old-key") and keys.allows("inline") and not keys.allows("# a comment")
    path.write_text("old-key\nnew-key\n")
    os.utime(path, ns=(1, 10**18))  # a new mtime, however coarse the filesystem's clock
    assert keys.allows("new-key") and keys.allows("old-key")
    path.write_text("new-key\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert keys.allows("new-key") and not keys.allows("old-key")
    path.unlink()  # mid-rotation: the last good set stays
    assert keys.allows("new-key")


def test_a_missing_file_at_start_is_a_clear_exit(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"LLM_API_KEYS_FILE=.*cannot read"):
        ApiKeys("", tmp_path / "absent", file_setting="LLM_API_KEYS_FILE")


def test_refusals_say_what_to_do_and_never_hold_the_key() -> None:
    keys = ApiKeys("right", how="send the header")
    assert keys.refusal(None) == "missing API key: send the header"
    assert "wrong-secret" not in keys.refusal("wrong-secret")


def test_bearer_takes_what_clients_send() -> None:
    assert bearer("Bearer sk-1") == "sk-1" and bearer("bearer  sk-1 ") == "sk-1"
    assert bearer(None) is None and bearer("") is None and bearer("Basic abc") is None
    assert bearer("Bearer") is None and bearer("Bearer   ") is None
