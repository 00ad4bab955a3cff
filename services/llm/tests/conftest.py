"""Fixtures: the tiny random model (built once per run) and real thinker servers on localhost.

No fakes: the model is a real Qwen3 (random weights), served by the real gRPC server on a
free port, called through the generated stubs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from voice.llm.v1 import thinker_pb2 as pb
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc
from voice_llm.server import ThinkerServer
from voice_llm.settings import Settings
from voice_llm.tiny_random import ensure_tiny_random


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("llm-cache")
    ensure_tiny_random(d)
    return d


def make_settings(cache_dir: Path, **kw: object) -> Settings:
    base: dict[str, object] = dict(
        backend="transformers",
        model="tiny-random",
        cache_dir=cache_dir,
        grpc_host="127.0.0.1",
        grpc_port=0,
        http_port=0,
        max_concurrent=3,
        max_tokens_limit=1000,
        max_model_len=2048,
        drain_seconds=2.0,
        torch_threads=1,
    )
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


class Thinker:
    """A running server plus a channel and stub to it."""

    def __init__(self, server: ThinkerServer, channel: grpc.aio.Channel) -> None:
        self.server = server
        self.channel = channel
        self.stub = pb_grpc.ThinkerStub(channel)

    @property
    def backend(self):
        return self.server.backend

    def metric(self, name: str, labels: str = "") -> float:
        text = self.server.metrics.render().decode()
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    async def chat(self, req: pb.ChatRequest) -> list[pb.ChatDelta]:
        return [d async for d in self.stub.Chat(req)]


@pytest_asyncio.fixture(scope="session")
async def thinker(cache_dir: Path) -> AsyncIterator[Thinker]:
    server = ThinkerServer(make_settings(cache_dir))
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield Thinker(server, channel)
    await server.stop()


def user(*parts: str | pb.AudioPart, role: int = pb.ROLE_USER) -> pb.Message:
    return pb.Message(
        role=role,
        parts=[pb.Part(text=p) if isinstance(p, str) else pb.Part(audio=p) for p in parts],
    )


def request(*messages: pb.Message, **kw: object) -> pb.ChatRequest:
    return pb.ChatRequest(messages=list(messages), **kw)  # type: ignore[arg-type]


def text_of(deltas: list[pb.ChatDelta]) -> str:
    return "".join(d.text for d in deltas)
