"""Chat streams text deltas that add up to what the model generates, with a correct final."""

from __future__ import annotations

import torch
from conftest import Thinker, request, text_of, user
from voice.llm.v1 import thinker_pb2 as pb
from voice_llm.backends.base import render_prompt


def reference_greedy(thinker: Thinker, messages: list[dict], max_new: int) -> tuple[str, int, int]:
    """HF generate on the same model, whole reply at once: the streaming oracle."""
    tok, model = thinker.backend.tokenizer, thinker.backend.model
    ids = tok(render_prompt(tok, messages), return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False
        )
    new = out[0, ids.shape[1] :]
    return tok.decode(new, skip_special_tokens=True), ids.shape[1], len(new)


async def test_stream_equals_whole_generation(thinker: Thinker) -> None:
    deltas = await thinker.chat(
        request(
            user("Hello there, how are you?"), max_tokens=40, temperature=0.0, request_id="trace-42"
        )
    )
    assert len(deltas) > 5, "the reply must arrive in many pieces, not one"
    assert all(d.request_id == "trace-42" for d in deltas), "request_id echoed in every delta"
    assert [d.HasField("final") for d in deltas] == [False] * (len(deltas) - 1) + [True]
    final = deltas[-1].final
    want, n_prompt, n_new = reference_greedy(
        thinker, [{"role": "user", "content": "Hello there, how are you?"}], 40
    )
    assert text_of(deltas) == want
    assert final.prompt_tokens == n_prompt
    assert final.completion_tokens == n_new == 40
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert 0 < final.ttft_ms <= final.total_ms


async def test_request_id_is_made_when_empty(thinker: Thinker) -> None:
    deltas = await thinker.chat(request(user("hi"), max_tokens=3))
    rid = deltas[0].request_id
    assert rid.startswith("chat-") and all(d.request_id == rid for d in deltas)


async def test_default_max_tokens_is_150(thinker: Thinker) -> None:
    # Greedy on the tiny model does not end its turn within 150 tokens (checked below).
    deltas = await thinker.chat(request(user("Count to a thousand."), temperature=0.0))
    final = deltas[-1].final
    assert final.completion_tokens == 150
    assert final.finish_reason == pb.FINISH_REASON_LENGTH


async def test_multi_turn_and_system_prompt_reach_the_model(thinker: Thinker) -> None:
    turns = [
        user("What is the weather like?"),
        user("It is sunny.", role=pb.ROLE_ASSISTANT),
        user("And tomorrow?"),
    ]
    deltas = await thinker.chat(
        request(*turns, system_prompt="You are brief.", max_tokens=12, temperature=0.0)
    )
    want, n_prompt, _ = reference_greedy(
        thinker,
        [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "What is the weather like?"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        12,
    )
    assert deltas[-1].final.prompt_tokens == n_prompt
    assert text_of(deltas) == want
    only_last = await thinker.chat(request(user("And tomorrow?"), max_tokens=12, temperature=0.0))
    assert only_last[-1].final.prompt_tokens < n_prompt


async def test_text_parts_of_a_message_are_joined(thinker: Thinker) -> None:
    a = await thinker.chat(request(user("Hello ", "world"), max_tokens=8, temperature=0.0))
    b = await thinker.chat(request(user("Hello world"), max_tokens=8, temperature=0.0))
    assert text_of(a) == text_of(b)
    assert a[-1].final.prompt_tokens == b[-1].final.prompt_tokens


async def test_seed_makes_sampling_repeatable(thinker: Thinker) -> None:
    def req(seed: int) -> pb.ChatRequest:
        return request(user("Tell me a story."), max_tokens=30, temperature=1.0, seed=seed)

    first = text_of(await thinker.chat(req(7)))
    again = text_of(await thinker.chat(req(7)))
    other = text_of(await thinker.chat(req(8)))
    assert first == again
    assert first != other


async def test_stop_string_cuts_the_reply(thinker: Thinker) -> None:
    whole = text_of(await thinker.chat(request(user("Go on."), max_tokens=60, temperature=0.0)))
    # A stop string taken from the middle of the greedy reply: the reply must end just
    # before its first occurrence, without it.
    stop = whole[20:24]
    assert stop.strip(), f"pick a visible stop string from {whole!r}"
    deltas = await thinker.chat(
        request(user("Go on."), max_tokens=60, temperature=0.0, stop=["never-there", stop])
    )
    got = text_of(deltas)
    assert got == whole[: whole.index(stop)]
    assert stop not in got
    assert deltas[-1].final.finish_reason == pb.FINISH_REASON_STOP
    assert deltas[-1].final.completion_tokens < 60


async def test_metrics_count_requests_and_tokens(thinker: Thinker) -> None:
    before_tokens = thinker.metric("llm_generated_tokens_total")
    before_ttft = thinker.metric("llm_ttft_seconds_count")
    deltas = await thinker.chat(request(user("hi"), max_tokens=5, temperature=0.0))
    assert thinker.metric("llm_generated_tokens_total") - before_tokens == 5
    assert deltas[-1].final.completion_tokens == 5
    assert thinker.metric("llm_ttft_seconds_count") == before_ttft + 1
    assert thinker.metric("llm_active_requests") == 0
