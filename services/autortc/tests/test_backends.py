"""`--spawn-backends`' start: a port picked as free but taken by another process before
the backend binds it is seen as such (not as a crash of the run), and the backends start
again on fresh ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from voice_autortc import backends
from voice_autortc.backends import Backends, PortTaken, _wait_healthy


def test_another_server_on_the_port_is_port_taken(tmp_path: Path) -> None:
    # what a gRPC server answers an HTTP/1.1 request with: HTTP/2 frames
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        conn.recv(1024)
        conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x05\x00\x00@\x00\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(PortTaken, match=f"port {port} answers as another server"):
            _wait_healthy("tts", proc, port, tmp_path / "tts.log", timeout_s=10)
    finally:
        proc.kill()
        srv.close()


def test_a_taken_port_starts_the_backends_again(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []

    def start(log_dir: Path, procs: list, *_: object) -> Backends:
        tries.append(len(procs))
        if len(tries) < 3:
            raise PortTaken("tts server exited with 1: address already in use")
        return Backends("127.0.0.1:1", "127.0.0.1:2")

    monkeypatch.setattr(backends, "_start", start)
    with backends.spawn_backends(tmp_path, tts_python="x", llm_python="y") as b:
        assert b.tts_addr == "127.0.0.1:1"
    assert len(tries) == 3
    tries.clear()
    monkeypatch.setattr(backends, "START_ATTEMPTS", 2)
    with pytest.raises(PortTaken), backends.spawn_backends(
            tmp_path, tts_python="x", llm_python="y"):
        pass
    assert len(tries) == 2
