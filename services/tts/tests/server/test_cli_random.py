"""The CLI (`make demo`, `make demo-chat`) against random weights: short audio, a reply
printed readably, and a line that says the weights are random."""

from __future__ import annotations

import asyncio
import sys
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc
from voice_tts.client.__main__ import RANDOM_MAX_FRAMES, _readable

LONG = "A sentence long enough that the server's own guard would allow many seconds. " * 3


async def _cli(*args: str) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voice_tts.client", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(p.communicate(), 120)
    return p.returncode or 0, out.decode(), err.decode()


def _seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


async def test_random_weights_cap_the_audio_unless_max_frames_says(server, tmp_path) -> None:
    out = tmp_path / "demo.wav"
    rc, stdout, stderr = await _cli("--addr", server.addr, "--text", LONG, "--out", str(out))
    assert rc == 0, stderr
    assert "RANDOM WEIGHTS" in stdout and "--max-frames" in stdout, stdout
    assert _seconds(out) <= RANDOM_MAX_FRAMES / 12.5 + 0.01
    rc, stdout, stderr = await _cli("--addr", server.addr, "--text", "Hi.", "--out", str(out),
                                    "--max-frames", "5")
    assert rc == 0, stderr
    assert "RANDOM WEIGHTS" not in stdout and abs(_seconds(out) - 0.4) < 0.01


class _Babbler(thinker_pb2_grpc.ThinkerServicer):
    """A thinker that writes what random weights write: split UTF-8, control bytes."""

    async def Chat(self, request, context) -> AsyncIterator[thinker_pb2.ChatDelta]:
        for piece in ("Hi", " \ufffd\x07", "there"):
            yield thinker_pb2.ChatDelta(text=piece)
        yield thinker_pb2.ChatDelta(final=thinker_pb2.ChatFinal(completion_tokens=3))


async def test_chat_prints_babble_readably_and_says_so(server, tmp_path) -> None:
    thinker = grpc.aio.server()
    thinker_pb2_grpc.add_ThinkerServicer_to_server(_Babbler(), thinker)
    port = thinker.add_insecure_port("127.0.0.1:0")
    await thinker.start()
    try:
        rc, stdout, stderr = await _cli("--addr", server.addr, "--chat", "Hello?", "--thinker",
                                        f"127.0.0.1:{port}", "--out", str(tmp_path / "c.wav"))
    finally:
        await thinker.stop(None)
    assert rc == 0, stderr
    assert "thinker: Hi ··there" in stdout, stdout
    assert "3 tokens" in stdout and "random weights babble" in stdout, stdout


def test_readable_keeps_text_and_newlines() -> None:
    assert _readable("Hello, 世界!\nBye.") == "Hello, 世界!\nBye."
    assert _readable("a\ufffd\x1b[2Jb\t") == "a··[2Jb·"
