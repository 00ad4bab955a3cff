"""`bench/openloop.py --protocol`: the same arrivals over gRPC, the OpenAI HTTP front
(streamed PCM) and the WebSocket, one row each, through one real server (tiny model,
CPU); and the options a protocol cannot honour are refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.openloop import parse_args
from bench.soak.cli import parse_args as soak_args

ROOT = Path(__file__).resolve().parents[2]  # the repository: the bench's cwd
# Short sentences: a call's audio (~1 s) ends soon after its arrival, so each of the six
# runs (a warm-up and a count per protocol) drains in a second or two.
PROMPTS = ["Hello there.", "Good day.", "See you soon.", "Thank you."]


def test_protocol_options_are_checked() -> None:
    assert parse_args([]).protocols == ["grpc"]
    assert parse_args(["--protocol", "all"]).protocols == ["grpc", "http", "ws"]
    assert parse_args(["--protocol", "ws", "--stream-text"]).protocols == ["ws"]
    for proto in ("http", "all"):  # HTTP takes the text whole
        with pytest.raises(SystemExit):
            parse_args(["--protocol", proto, "--stream-text"])
    with pytest.raises(SystemExit):  # STOP/RESET/cancel are the gRPC client's
        soak_args(["--protocol", "ws"])
    with pytest.raises(SystemExit):  # the fronts live on the HTTP port
        soak_args(["--protocol", "http", "--http-port", "0", "--stop-share", "0",
                   "--reset-share", "0", "--cancel-share", "0"])


@pytest.mark.slow
def test_all_protocols_at_one_rate_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "ol.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    # seed 2 at 2/s: 3 counted arrivals in 3 s, 2 in each 1 s warm-up
    r = subprocess.run(
        [sys.executable, "-m", "bench.openloop", "--start-server", "--model", "preset:tiny",
         "--max-sessions", "8", "--protocol", "all", "--rates", "2", "--duration", "3",
         "--warmup", "1", "--seed", "2", "--procs", "1", "--prompts", str(prompts),
         "--out", str(out), "--server-log", str(tmp_path / "server.log"),
         "--server-env", "TTS_ADMIT_MARGIN=0", "--stop-above-ms", "60000"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), r.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["protocols"] == ["grpc", "http", "ws"]
    rows = result["rows"]
    assert [(row["rate"], row["protocol"]) for row in rows] == \
        [(2.0, "grpc"), (2.0, "http"), (2.0, "ws")], r.stderr[-3000:]
    ok_code = {"grpc": "OK", "http": "HTTP_200", "ws": "WS_1000"}
    for row in rows:
        assert row["pass"], (row["protocol"], row["failures"])
        assert row["calls"] == 3 and row["errors"] == 0 and row["rejected"] == 0
        assert row["by_code"] == {ok_code[row["protocol"]]: 3}
        t = row["ttfa_ms"]
        assert t["n"] == 3 and 0 < t["p50"] <= t["p95"], row["protocol"]
        # the server's TTFA: gRPC and WS events, the HTTP response's header
        assert row["server_ttfa_ms"]["n"] == 3, row["protocol"]
        u = row["underruns"]
        assert u["frames"] > 0 and u["late_frames"] >= u["over_20ms"] >= u["over_100ms"]
    # each protocol has its own warm-up: three runs of 1 s arrivals, each with calls
    assert r.stderr.count("2 arrivals planned over 1 s") == 3, r.stderr[-3000:]
    assert [ln.split()[3] for ln in r.stderr.splitlines()
            if ln.startswith("openloop: rate ")] == ["grpc", "http", "ws"]
    table = r.stderr[r.stderr.rindex("rate protocol"):].splitlines()
    assert [ln.split()[1] for ln in table[1:4]] == ["grpc", "http", "ws"]
    assert r.returncode == 0, r.stderr[-3000:]
