"""`bench/front_bench.py` end to end on CPU (the real server front on the stand-in engine):
the same closed level over gRPC and over the WebSocket delivers every frame, and the
WebSocket's refusals count as refusals (an `error` event and close 1013), not failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository: the bench's cwd


def level(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    r = subprocess.run([sys.executable, "-m", "bench.front_bench", "--frames", "10",
                        "--client-procs", "1", *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", ["grpc", "ws"])
def test_every_frame_of_every_stream_arrives(protocol: str) -> None:
    row = level("--streams", "4", "--protocol", protocol)
    assert row["protocol"] == protocol and row["ok"] == 4 and row["other"] == []
    assert row["frames_received"] == 4 * 10 * 4  # 10 codec frames of 80 ms, in 20 ms frames
    assert row["server"]["frames"] == row["frames_received"]
    # A CPU figure of a 160-frame run is noise on a busy host: only its sign is asserted
    # (the front's CPU is the process's minus the engine thread's over the same window).
    assert row["cpu_us_per_frame"] >= 0 and row["ttfa_ms_p50"] is not None


def test_websocket_refusals_are_counted_as_refusals() -> None:
    row = level("--streams", "5", "--protocol", "ws", "--max-sessions", "2")
    assert row["rejected"] == 3 and row["ok"] == 2 and row["other"] == []
    assert row["frames_received"] == 2 * 10 * 4
    assert "limit of 2 open streams" in row["reject_message"]
