"""`python -m voice_agent --direct --in user.wav --out reply.wav` end to end (real servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np

from .backends import Server


def test_direct_cli_answers_a_wav_and_writes_the_reply(tts_server: Server, thinker: Server,
                                                      tmp_path: Path) -> None:
    user = tmp_path / "user.wav"
    subprocess.run(["espeak-ng", "-w", str(user), "Hello, can you hear me?"], check=True)
    out = tmp_path / "reply.wav"
    env = {**os.environ, "AGENT_TTS_ADDR": tts_server.addr, "AGENT_THINKER_ADDR": thinker.addr,
           "AGENT_TTS_VOICE": "aiden", "AGENT_TTS_MAX_FRAMES": "25",
           "AGENT_LLM_MAX_TOKENS": "16", "AGENT_STT_MAX_TOKENS": "16",
           "AGENT_STARTER_CACHE": "false"}
    r = subprocess.run([sys.executable, "-m", "voice_agent", "--direct", "--no-greeting",
                        "--in", str(user), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    turns = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [t["kind"] for t in turns] == ["user"]
    assert turns[0]["eot_to_first_audio_ms"] > 0
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    # the agent's side on the microphone's timeline: silence while the user speaks, then
    # the reply (noise from the random TTS)
    user_s = 2.0
    assert len(pcm) / 24000 > user_s
    assert np.abs(pcm[int(user_s * 24000):]).max() > 0


def test_direct_cli_answers_a_wav_that_ends_in_a_long_silence(tts_server: Server,
                                                              thinker: Server,
                                                              tmp_path: Path) -> None:
    """1.5 s of silence after the speech: the turn ends (and the reply starts) while the
    WAV is still playing; the CLI must see that reply, not wait for a later one (it used
    to wait out the turn timeout and log "no reply")."""
    speech = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(speech), "Hello, can you hear me?"], check=True)
    with wave.open(str(speech)) as w:
        rate, pcm = w.getframerate(), w.readframes(w.getnframes())
    user = tmp_path / "user.wav"
    with wave.open(str(user), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm + b"\0\0" * int(1.5 * rate))
    env = {**os.environ, "AGENT_TTS_ADDR": tts_server.addr, "AGENT_THINKER_ADDR": thinker.addr,
           "AGENT_TTS_VOICE": "aiden", "AGENT_TTS_MAX_FRAMES": "10",
           "AGENT_LLM_MAX_TOKENS": "4", "AGENT_STT_MAX_TOKENS": "8",
           "AGENT_STARTER_CACHE": "false"}
    # Long enough that the process's own start on a busy 2-core host (20-50 s seen with
    # two CI lanes and more) stays under it; a CLI that waits it out takes longer still.
    timeout = 90
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "voice_agent", "--direct", "--no-greeting",
                        "--in", str(user), "--turn-timeout", str(timeout)],
                       env=env, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no reply" not in r.stderr, r.stderr[-3000:]
    assert took < timeout, f"{took:.0f} s: it waited out the turn timeout"
    turns = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [t["kind"] for t in turns] == ["user"] and turns[0]["eot_to_first_audio_ms"] > 0
