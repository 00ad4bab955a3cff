"""The small programs the images run: the health probe and the model-download job.

The probe is run as the containers run it, against a real HTTP server on localhost. The
download job is exercised up to the network: its plan (what to fetch, what is already
there, what is not a repo id); Hugging Face itself is a boundary we cannot reach here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from deploy_support import DEPLOY

sys.path.insert(0, str(DEPLOY / "models"))
import download  # deploy/models is not a package: imported by path

PROBE = DEPLOY / "docker" / "healthcheck.py"


@pytest.fixture
def server():
    """A /healthz that answers with whatever status the test sets."""
    state = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            code = state["status"] if self.path == "/healthz" else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok" if code == 200 else b"no")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], state
    httpd.shutdown()


def probe(var: str, value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != var}
    if value is not None:
        env[var] = value
    return subprocess.run([sys.executable, str(PROBE), var], env=env, capture_output=True,
                          text=True, timeout=30)


def test_probe_is_healthy_only_on_2xx(server):
    port, state = server
    assert probe("TTS_HTTP_PORT", str(port)).returncode == 0
    state["status"] = 503  # warming up
    assert probe("TTS_HTTP_PORT", str(port)).returncode == 1


def test_probe_fails_clearly_when_nothing_listens_or_the_port_is_bad():
    closed = probe("AGENT_HTTP_PORT", "1")  # nothing listens on port 1
    assert closed.returncode == 1 and "127.0.0.1:1/healthz" in closed.stderr
    bad = probe("AGENT_HTTP_PORT", "eighty")
    assert bad.returncode == 2 and "AGENT_HTTP_PORT" in bad.stderr
    assert probe("AGENT_HTTP_PORT", None).returncode == 2


def test_download_plans_each_repo_once(tmp_path: Path):
    env = {"TTS_HF_REPO": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
           "TTS_BASE_HF_REPO": "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
           "TTS_DESIGN_HF_REPO": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
           "LLM_HF_REPO": "org/thinker-AWQ@v1.0"}
    todo = download.plan(env, tmp_path)
    assert todo == [
        ("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", None, tmp_path / "tts"),
        ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", None, tmp_path / "tts-base"),
        ("Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", None, tmp_path / "tts-design"),
        ("org/thinker-AWQ", "v1.0", tmp_path / "thinker"),
    ]
    # A finished download (marker holding the same id) is not fetched again...
    for name, var in (("tts", "TTS_HF_REPO"), ("tts-base", "TTS_BASE_HF_REPO")):
        (tmp_path / name).mkdir()
        (tmp_path / name / download.MARKER).write_text(env[var] + "\n")
    assert [d for _, _, d in download.plan(env, tmp_path)] == [
        tmp_path / "tts-design", tmp_path / "thinker"]
    # ...but another repo in the same place is, and an empty variable skips its target
    # (the designed-voice checkpoint is off by default: compose passes it empty).
    env["TTS_HF_REPO"] = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    env["TTS_BASE_HF_REPO"] = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
    skip = {"LLM_HF_REPO": "", "TTS_DESIGN_HF_REPO": ""}
    assert [d for _, _, d in download.plan(env | skip, tmp_path)] == [
        tmp_path / "tts", tmp_path / "tts-base"]
    # Unset is empty: a job with only the old two variables fetches only those two.
    assert [d for _, _, d in download.plan({"TTS_HF_REPO": "org/tts"}, tmp_path)] == [
        tmp_path / "tts"]


@pytest.mark.parametrize("var", ["TTS_HF_REPO", "TTS_BASE_HF_REPO", "TTS_DESIGN_HF_REPO"])
def test_download_rejects_what_is_not_a_repo_id(tmp_path: Path, var: str):
    for bad in ("not a repo", "https://huggingface.co/Qwen/x", "../../etc"):
        with pytest.raises(ValueError, match=var):
            download.plan({var: bad}, tmp_path)


def test_download_job_exits_at_once_when_everything_is_there(tmp_path: Path):
    for name in ("tts", "tts-base", "tts-design", "thinker"):
        (tmp_path / name).mkdir()
        (tmp_path / name / download.MARKER).write_text(f"org/{name}\n")
    env = {**os.environ, "MODELS_DIR": str(tmp_path), "TTS_HF_REPO": "org/tts",
           "TTS_BASE_HF_REPO": "org/tts-base", "TTS_DESIGN_HF_REPO": "org/tts-design",
           "LLM_HF_REPO": "org/thinker"}
    # huggingface_hub is not installed here: a no-op run must not even import it.
    proc = subprocess.run([sys.executable, str(DEPLOY / "models" / "download.py")], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "already in" in proc.stdout
    bad = subprocess.run([sys.executable, str(DEPLOY / "models" / "download.py")],
                         env=env | {"LLM_HF_REPO": "nope"}, capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "LLM_HF_REPO" in bad.stderr
    # -h prints what it fetches where, and fetches nothing (no network, no import).
    usage = subprocess.run([sys.executable, str(DEPLOY / "models" / "download.py"), "-h"],
                           env=env | {"TTS_BASE_HF_REPO": "nope"}, capture_output=True,
                           text=True, timeout=30)
    assert usage.returncode == 0, usage.stderr
    for name, var in download.TARGETS.items():
        assert re.search(rf"{var} +-> /models/{name}\s", usage.stdout), usage.stdout
