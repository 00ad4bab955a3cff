"""With random weights the mesh keeps replies short (a thinker's babble runs to its cap):
32 tokens for `make demo-chat` (the thinker's default) and for the page (the agent's own
cap); real weights keep 150, and a user's AGENT_LLM_MAX_TOKENS wins."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "local"))
import mesh


def envs(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, dict[str, str]]:
    for var in ("VOICE_LLM_WEIGHTS", "VOICE_TTS_WEIGHTS", "AGENT_LLM_MAX_TOKENS",
                "MESH_SERVICES"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {s.name: s.env for s in mesh.services()}


def test_random_thinker_replies_are_short_for_the_demo_and_the_page(monkeypatch) -> None:
    e = envs(monkeypatch)
    assert e["thinker"]["LLM_DEFAULT_MAX_TOKENS"] == "32"
    assert e["agent"]["AGENT_LLM_MAX_TOKENS"] == "32"
    assert envs(monkeypatch, AGENT_LLM_MAX_TOKENS="24")["agent"]["AGENT_LLM_MAX_TOKENS"] == "24"


def test_real_weights_keep_the_services_defaults(monkeypatch, tmp_path) -> None:
    e = envs(monkeypatch, VOICE_LLM_WEIGHTS=str(tmp_path))
    assert "LLM_DEFAULT_MAX_TOKENS" not in e["thinker"]
    assert "AGENT_LLM_MAX_TOKENS" not in e["agent"]
