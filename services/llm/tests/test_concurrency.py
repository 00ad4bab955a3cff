"""Concurrent calls: each gets what it would get alone; one over the limit is rejected."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from conftest import Thinker, request, text_of, user


def seeded(i: int = 0, max_tokens: int = 24):
    return request(user(f"Question {i}?"), max_tokens=max_tokens, temperature=0.8, seed=100 + i)


async def test_concurrent_requests_equal_alone(thinker: Thinker) -> None:
    alone = [text_of(await thinker.chat(seeded(i))) for i in range(3)]
    together = await asyncio.gather(*(thinker.chat(seeded(i)) for i in range(3)))
    assert [text_of(d) for d in together] == alone
    identical = await asyncio.gather(*(thinker.chat(seeded(0)) for _ in range(3)))
    assert {text_of(d) for d in identical} == {alone[0]}


async def test_join_mid_generation_of_another(thinker: Thinker) -> None:
    alone = text_of(await thinker.chat(seeded(5, max_tokens=10)))
    long_call = thinker.stub.Chat(
        request(user("Long one."), max_tokens=1000, temperature=0.0, request_id="long")
    )
    await long_call.read()  # the long one is generating
    joined = text_of(await thinker.chat(seeded(5, max_tokens=10)))
    long_call.cancel()
    assert joined == alone


async def test_over_the_limit_is_resource_exhausted(thinker: Thinker) -> None:
    limit = thinker.server.settings.max_concurrent
    calls = [
        thinker.stub.Chat(
            request(user("Hold."), max_tokens=1000, temperature=0.0, request_id=f"hold-{i}")
        )
        for i in range(limit)
    ]
    for call in calls:
        await call.read()  # admitted and generating
    assert thinker.metric("llm_active_requests") == limit
    rejected = thinker.metric("llm_errors_total", 'code="RESOURCE_EXHAUSTED"')
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await thinker.chat(request(user("One more."), max_tokens=5))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "LLM_MAX_CONCURRENT" in err.value.details()
    assert thinker.metric("llm_errors_total", 'code="RESOURCE_EXHAUSTED"') == rejected + 1

    for call in calls:
        call.cancel()
    for _ in range(200):  # slots free as the cancelled handlers finish
        if thinker.metric("llm_active_requests") == 0:
            break
        await asyncio.sleep(0.01)
    deltas = await thinker.chat(request(user("Now?"), max_tokens=5, temperature=0.0))
    assert deltas[-1].final.completion_tokens == 5
