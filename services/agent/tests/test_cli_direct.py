"""`python -m voice_agent --direct --in user.wav --out reply.wav` end to end (real servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
