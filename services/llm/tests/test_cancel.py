"""Cancelling a Chat call stops the generation in the backend, verified by its step count."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from conftest import Thinker, request, text_of, user


async def wait_done(thinker: Thinker, rid: str, timeout: float = 5.0) -> tuple[int, float]:
    """Polls the backend until the request's generation thread has ended."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        steps, done = thinker.backend.steps_run(rid)
        if done:
            return steps, time.perf_counter() - start
        await asyncio.sleep(0.005)
    raise AssertionError(f"generation of {rid} still running {timeout} s after cancel")


async def test_cancel_mid_stream_aborts_generation(thinker: Thinker) -> None:
    aborts = thinker.metric("llm_aborts_total")
    rid = "cancel-mid-stream"
    call = thinker.stub.Chat(
        request(user("Talk for a long time."), max_tokens=1000, temperature=0.0, request_id=rid)
    )
    got = []
    async for delta in call:
        got.append(delta)
        if len(got) == 5:
            break
    steps_before, done = thinker.backend.steps_run(rid)
    assert not done and steps_before >= 5, "the generation must be running when we cancel"
    call.cancel()

    steps, waited = await wait_done(thinker, rid)
    # 1000 steps take seconds on CPU; a real abort ends the loop within a few steps.
    assert steps < 500, f"generation ran on to {steps} steps after cancel"
    assert waited < 1.0
    await asyncio.sleep(0.2)
    assert thinker.backend.steps_run(rid) == (steps, True), "no step after the abort"
    assert thinker.metric("llm_aborts_total") == aborts + 1
    assert thinker.metric("llm_active_requests") == 0
    assert await call.code() == grpc.StatusCode.CANCELLED
    print(f"cancel: {steps_before} steps seen at cancel, {steps} at stop, {waited * 1e3:.1f} ms")


async def test_deadline_aborts_generation(thinker: Thinker) -> None:
    rid = "deadline"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in thinker.stub.Chat(
            request(user("Talk."), max_tokens=1000, temperature=0.0, request_id=rid),
            timeout=0.3,
        ):
            pass
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    steps, _ = await wait_done(thinker, rid)
    assert steps < 1000


async def test_server_works_after_cancels(thinker: Thinker) -> None:
    for i in range(3):
        call = thinker.stub.Chat(
            request(user("Again."), max_tokens=1000, temperature=0.0, request_id=f"c{i}")
        )
        await call.read()
        call.cancel()
        await wait_done(thinker, f"c{i}")
    deltas = await thinker.chat(request(user("Still there?"), max_tokens=6, temperature=0.0))
    assert deltas[-1].final.completion_tokens == 6
    assert text_of(deltas)
    assert thinker.backend.active_requests == 0


async def test_a_request_id_is_free_once_its_reply_has_ended(thinker: Thinker,
                                                            monkeypatch) -> None:
    """The backend forgets a request before its reader sees the end: active_requests is 0
    when the final delta arrives, and the same id may be used again at once. The batcher
    thread is made to pause after each hand-over to the loop, as a busy host preempts it
    (it handed the end over in two calls: the reply ended, the request not yet forgotten)."""
    loop = asyncio.get_running_loop()
    hand_over = loop.call_soon_threadsafe
    loop_thread = threading.get_ident()

    def preempted(callback, *args, **kw):
        handle = hand_over(callback, *args, **kw)
        if threading.get_ident() != loop_thread:
            time.sleep(0.05)
        return handle

    monkeypatch.setattr(loop, "call_soon_threadsafe", preempted)
    for _ in range(2):
        deltas = await thinker.chat(request(user("Hi."), max_tokens=3, temperature=0.0,
                                            request_id="same-id"))
        assert deltas[-1].final.completion_tokens == 3
        assert thinker.backend.active_requests == 0


async def test_backend_abort_ends_a_stream_being_read(thinker: Thinker) -> None:
    """A server-side abort (drain) ends the call with ABORTED rather than a false final."""
    rid = "server-abort"
    call = thinker.stub.Chat(
        request(user("Talk."), max_tokens=1000, temperature=0.0, request_id=rid)
    )
    await call.read()
    await thinker.backend.abort(rid)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while (d := await call.read()) is not grpc.aio.EOF:
            assert not d.HasField("final")
    assert err.value.code() == grpc.StatusCode.ABORTED
    steps, _ = await wait_done(thinker, rid)
    assert steps < 1000
