"""`LLM_MODEL=random:<shape>`: a real thinker's shape with random weights made at load (GPU
benchmarks). Here a small stand-in shape on the CPU: the dir holds no weights, the
server loads and answers, and the LM head's padding past the tokenizer is never sampled
(every id decodes to text)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from conftest import make_settings, request, text_of, user
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc
from voice_llm import tiny_random
from voice_llm.server import ThinkerServer


@pytest.fixture
def small_shape(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(tiny_random.SHAPES, "test-small", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True))
    return "random:test-small"


async def test_a_random_shape_loads_without_weight_files_and_answers(
        tmp_path: Path, small_shape: str) -> None:
    server = ThinkerServer(make_settings(tmp_path, model=small_shape))
    await server.start()
    try:
        d = tiny_random.ensure_random_shape(tmp_path, "test-small")
        assert not list(d.glob("*.safetensors")) and (d / tiny_random.RANDOM_MARKER).exists()
        backend = server.backend
        assert backend.model.config.vocab_size == 151936 > len(backend.tokenizer)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            stub = pb_grpc.ThinkerStub(ch)
            for temperature in (0.0, 1.0):
                deltas = [d async for d in stub.Chat(request(
                    user("Hello there"), max_tokens=40, temperature=temperature, seed=3))]
                final = deltas[-1].final
                assert final.completion_tokens > 0
                # Padding ids, byte fragments and control characters would decode to
                # nothing or to U+FFFD: random weights write printable text, every token.
                text = text_of(deltas)
                assert len(text) >= final.completion_tokens
                assert text.isprintable() and "\ufffd" not in text, repr(text)
    finally:
        await server.stop()


def test_unknown_shapes_and_backends_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="random weights at a real shape"):
        make_settings(tmp_path, model="random:qwen9-100b")
    with pytest.raises(ValueError, match="LLM_BACKEND=transformers"):
        make_settings(tmp_path, model="random:qwen3-1.7b", backend="vllm")
