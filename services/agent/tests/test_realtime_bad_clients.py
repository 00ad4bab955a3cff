"""`/v1/realtime` held to OpenAI's behaviour under bad clients, with no backend behind it
(the thinker and the TTS addresses answer nothing: every check here comes before them):

- every wrongly typed or shaped value in `session.update`, `response.create` and
  `conversation.item.create` (lists, objects, nested lists, non-finite numbers) is an
  `invalid_request_error` naming the parameter and the client's `event_id`, never a
  `server_error`;
- NaN / Infinity are not JSON: refused, never echoed back;
- `response.input` is refused (it is not supported);
- the session's items are bounded (an item, their count, their text);
- a 100 ms commit is 100 ms, however the appends cut it;
- a client that stops reading, floods, then resets its connection gives its slot back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest
from voice_agent.realtime import items as rt_items
from voice_agent.realtime import session as rt_session
from voice_agent.realtime.session import RealtimeSession
from voice_agent.settings import AgentSettings

from .test_ws_talk import serve

pytestmark = pytest.mark.timeout(120)

NOWHERE = "127.0.0.1:9"  # the discard port: nothing listens, a call fails at once


def settings(**kw: Any) -> AgentSettings:
    base: dict[str, Any] = dict(tts_addr=NOWHERE, thinker_addr=NOWHERE, tts_voice="aiden",
                                http_port=0, greeting="", starter_cache=False,
                                admit_max_lag_ms=0)
    base.update(kw)
    return AgentSettings(**base)


class Session:
    """A RealtimeSession driven event by event, its server events read from its outbox."""

    def __init__(self) -> None:
        async def check(name: str) -> str:
            return name

        self.s = RealtimeSession(settings(), lambda _: None, beta=False, check_voice=check)
        self.s.start()
        self.out: list[dict[str, Any]] = []

    async def send(self, ev: dict[str, Any] | str) -> list[dict[str, Any]]:
        """The events the server answers `ev` with (its handler's, not later tasks')."""
        raw = ev if isinstance(ev, str) else json.dumps(ev)
        await self.s.handle(raw)
        assert not self.s.stalled
        got = [json.loads(e) for e in self.s.outbox.take()]
        self.out += got
        return got

    async def close(self) -> None:
        await self.s.close()


@pytest.fixture
async def rt() -> Any:
    s = Session()
    await s.send({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": None}}}})  # no server VAD: nothing runs unasked
    yield s
    await s.close()


# The values issue 62 found answered with `server_error`, each at its field.
WRONG_TYPES = [
    ({"input_audio_format": ["pcm16"]}, "session.input_audio_format"),
    ({"output_audio_format": ["g711_ulaw"]}, "session.output_audio_format"),
    ({"audio": {"input": {"format": {"type": ["audio/pcm"]}}}}, "session.audio.input.format.type"),
    ({"audio": {"output": {"format": {"type": {"x": 1}}}}}, "session.audio.output.format.type"),
    ({"modalities": [["audio"]]}, "session.modalities"),
    ({"output_modalities": [{}]}, "session.output_modalities"),
    ({"turn_detection": {"silence_duration_ms": 1e999}},
     "session.turn_detection.silence_duration_ms"),
    ({"turn_detection": {"prefix_padding_ms": 1e999}}, "session.turn_detection.prefix_padding_ms"),
    ({"tool_choice": {"type": "function", "name": ["x"]}}, "session.tool_choice"),
    ({"tool_choice": {"type": "function", "function": "x"}}, "session.tool_choice"),
    ({"tools": [{"type": "function", "name": "f", "description": ["d"]}]},
     "session.tools[0].description"),
]


@pytest.mark.parametrize(("session", "param"), WRONG_TYPES)
async def test_a_wrongly_typed_session_value_names_its_parameter(
        rt: Session, session: dict[str, Any], param: str) -> None:
    # 1e999 parses as inf only through Python's own float(): sent as a number literal
    raw = json.dumps({"type": "session.update", "event_id": "ev_1", "session": session})
    raw = raw.replace("Infinity", "1e999")
    got = await rt.send(raw)
    assert [e["type"] for e in got] == ["error"], got
    err = got[0]["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["event_id"] == "ev_1"


async def test_nan_and_infinity_are_refused_not_echoed(rt: Session) -> None:
    for literal in ("NaN", "Infinity", "-Infinity"):
        got = await rt.send('{"type": "response.create", "event_id": "ev_2", "response": '
                            f'{{"metadata": {{"x": {literal}}}}}}}')
        assert [e["type"] for e in got] == ["error"]
        assert got[0]["error"]["code"] == "invalid_json", got
        assert got[0]["error"]["type"] == "invalid_request_error"
    assert rt.s.response is None  # no response started, nothing to echo the value in


async def test_response_input_is_refused(rt: Session) -> None:
    got = await rt.send({"type": "response.create", "event_id": "ev_3", "response": {
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "hi"}]}]}})
    assert [e["type"] for e in got] == ["error"]
    assert got[0]["error"]["param"] == "response.input"
    assert got[0]["error"]["event_id"] == "ev_3"
    assert rt.s.response is None


def text_item(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def test_items_are_bounded(rt: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    got = await rt.send(text_item("x" * (rt_items.MAX_ITEM_CHARS + 1)))
    assert got[0]["type"] == "error" and got[0]["error"]["param"] == "item"
    assert rt.s.items.all == []
    monkeypatch.setattr(rt_items, "MAX_CONVERSATION_CHARS", 2500)
    monkeypatch.setattr(rt_items, "MAX_ITEMS", 5)
    for _ in range(2):
        assert (await rt.send(text_item("y" * 1000)))[0]["type"] == "conversation.item.added"
    got = await rt.send(text_item("z" * 1000))  # 3,000 characters: over the 2,500
    assert got[0]["error"]["code"] == "conversation_too_large", got
    for _ in range(3):
        assert (await rt.send(text_item("w")))[0]["type"] == "conversation.item.added"
    got = await rt.send(text_item("v"))  # a sixth item
    assert got[0]["error"]["code"] == "conversation_too_large", got
    assert len(rt.s.items) == 5
    # the agent's own replies make room: the oldest items go, each said
    monkeypatch.setattr(rt_items, "MAX_ITEMS", 3)
    rt.s.items.make_room()
    deleted = [e["item_id"] for e in await rt.send("{}") if e["type"] ==
               "conversation.item.deleted"]
    assert len(deleted) == 2 and len(rt.s.items) == 3


def pcm_b64(ms: int) -> str:
    n = 24 * ms
    tone = (3000 * np.sin(np.arange(n) * 2 * math.pi * 220 / 24000)).astype(np.int16)
    return base64.b64encode(tone.tobytes()).decode()


async def test_a_100_ms_commit_is_taken(rt: Session) -> None:
    """100 ms appended as 7 pieces of odd sizes: the resampler and the 20 ms framer hold
    the last ms back, and the buffer once read 60 ms and refused the commit."""
    for ms in (13, 17, 9, 21, 11, 19):
        await rt.send({"type": "input_audio_buffer.append", "audio": pcm_b64(ms)})
    await rt.send({"type": "input_audio_buffer.append", "audio": pcm_b64(10)})
    got = await rt.send({"type": "input_audio_buffer.commit"})
    assert got and got[0]["type"] == "input_audio_buffer.committed", got
    # 99 ms is refused
    await rt.send({"type": "input_audio_buffer.append", "audio": pcm_b64(99)})
    got = await rt.send({"type": "input_audio_buffer.commit"})
    assert got[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    assert "have 99 ms" in got[0]["error"]["message"]


async def test_wrong_shapes_in_every_field_never_give_a_server_error(rt: Session) -> None:
    """Every field a client event takes, set to each wrong type and shape in turn: each
    is answered as the API says (an invalid_request_error, or taken), never server_error."""
    odd: list[Any] = [None, True, -1, 0, 1.5, 1e308, "x", "", [], [[]], ["x"], [{}], {},
                      {"type": "function"}, {"type": ["x"]}, [[1, 2]], 2**64]
    paths = {
        "session.update": [
            ("session",), ("session", "instructions"), ("session", "voice"),
            ("session", "input_audio_format"), ("session", "output_audio_format"),
            ("session", "modalities"), ("session", "output_modalities"),
            ("session", "temperature"), ("session", "max_output_tokens"),
            ("session", "max_response_output_tokens"), ("session", "tools"),
            ("session", "tool_choice"), ("session", "turn_detection"),
            ("session", "input_audio_transcription"),
            ("session", "audio"), ("session", "audio", "input"),
            ("session", "audio", "input", "format"), ("session", "audio", "output", "format"),
            ("session", "audio", "input", "format", "type"),
            ("session", "audio", "input", "format", "rate"),
            ("session", "audio", "output", "voice"),
            ("session", "audio", "input", "turn_detection"),
            *[("session", "turn_detection", k) for k in (
                "type", "threshold", "silence_duration_ms", "prefix_padding_ms",
                "create_response", "interrupt_response", "eagerness")],
            ("session", "tools", 0), *[("session", "tools", 0, k) for k in (
                "type", "name", "description", "parameters")],
            ("session", "tool_choice", "name"), ("session", "tool_choice", "function"),
        ],
        "response.create": [
            ("response",), *[("response", k) for k in (
                "instructions", "tools", "tool_choice", "output_modalities", "modalities",
                "max_output_tokens", "metadata", "conversation", "input")],
        ],
        "conversation.item.create": [
            ("item",), ("previous_item_id",), *[("item", k) for k in (
                "type", "id", "role", "content", "call_id", "output", "name", "arguments")],
            ("item", "content", 0), *[("item", "content", 0, k) for k in (
                "type", "text", "audio", "transcript")],
        ],
        "conversation.item.truncate": [("item_id",), ("content_index",), ("audio_end_ms",)],
        "conversation.item.delete": [("item_id",)],
        "conversation.item.retrieve": [("item_id",)],
        "input_audio_buffer.append": [("audio",)],
        "response.cancel": [("response_id",)],
    }
    base: dict[str, dict[str, Any]] = {
        "session.update": {"session": {"audio": {"input": {"format": {"type": "audio/pcm"},
                                                            "turn_detection": None},
                                                  "output": {"format": {"type": "audio/pcm"}}},
                                        "turn_detection": {"type": "server_vad"},
                                        "tools": [{"type": "function", "name": "f"}],
                                        "tool_choice": {"type": "function", "name": "f"}}},
        "response.create": {"response": {"output_modalities": ["text"]}},
        "conversation.item.create": {"item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "hi"}]}},
    }
    kinds: set[str] = set()
    for kind, fields in paths.items():
        for path in fields:
            for value in odd:
                ev: dict[str, Any] = json.loads(json.dumps(base.get(kind, {})))
                ev.update(type=kind, event_id="ev_odd")
                put(ev, path, value)
                for e in await rt.send(ev):
                    kinds.add(e["type"])
                    if e["type"] == "error":
                        assert e["error"]["type"] == "invalid_request_error", (ev, e)
                        assert e["error"]["event_id"] == "ev_odd", (ev, e)
                await rt.send({"type": "response.cancel"})  # whatever started
                if rt.s.response is not None:
                    await rt.s.response.handle
    assert "error" in kinds and "session.updated" in kinds


def put(ev: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """ev[path...] = value, making the containers on the way."""
    node: Any = ev
    for i, key in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, list):
            while len(node) <= key:
                node.append({})
            if not isinstance(node[key], dict | list):
                node[key] = [] if isinstance(nxt, int) else {}
            node = node[key]
            continue
        if not isinstance(node.get(key), dict | list):
            node[key] = [] if isinstance(nxt, int) else {}
        node = node[key]
    if isinstance(node, list):
        while len(node) <= path[-1]:
            node.append({})
    node[path[-1]] = value


def raw_client(port: int) -> socket.socket:
    """A raw WebSocket client of /v1/realtime with a 4 KiB receive buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.settimeout(5.0)
    return sock


def frame(event: dict[str, Any]) -> bytes:
    """`event` as a masked text frame, as a client sends it."""
    payload = json.dumps(event).encode()
    mask = b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + masked


def flood(sock: socket.socket, n: int, stop: threading.Event) -> int:
    """`n` response.cancel events with a 2 KB event_id (each answered with an error quoting
    it), never read. Returns how many went out before the server stopped taking them."""
    cancel = frame({"type": "response.cancel", "event_id": "e" * 2000})
    sent = 0
    try:
        for _ in range(n):
            if stop.is_set():
                break
            sock.sendall(cancel)
            sent += 1
    except OSError:
        pass  # the server stopped reading or closed: the flood is done
    return sent


def flood_without_reading_then_reset(port: int, n: int, stop: threading.Event) -> int:
    """A flood (`flood`), then a reset (SO_LINGER 0) while the server closes."""
    sock = raw_client(port)
    sent = flood(sock, n, stop)
    # Still not reading while the server gives up on its sender (2 s) and closes, then the
    # reset: it landed in `ws.close()` as a CancelledError and skipped the slot's release.
    stop.wait(3.0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # RST
    return sent


def stop_reading_and_stream_on(port: int, stop: threading.Event) -> int:
    """Enough error events asked for to fill the socket's buffers (fewer than MAX_OUTBOX),
    then a mic streaming silence in 40 ms appends, nothing read, until `stop`. Returns
    the appends sent."""
    sock = raw_client(port)
    flood(sock, 2000, stop)
    append = frame({"type": "input_audio_buffer.append",
                    "audio": base64.b64encode(bytes(1920)).decode()})
    sent = 0
    try:
        while not stop.wait(0.04):
            sock.sendall(append)
            sent += 1
    except OSError:
        pass  # the server closed
    sock.close()
    return sent


async def test_a_client_that_stops_reading_then_resets_gives_its_slot_back() -> None:
    agent = await serve(settings(ws_max_sessions=1))
    try:
        port = int(agent.http.rsplit(":", 1)[1])
        stop = threading.Event()
        t0 = time.perf_counter()
        sent = await asyncio.to_thread(flood_without_reading_then_reset, port, 9000, stop)
        assert sent > rt_session.MAX_OUTBOX, sent  # enough to stall its session
        async with asyncio.timeout(30):
            while agent.hub.talking or agent.hub.sockets:
                await asyncio.sleep(0.05)
        # the one slot is free: the next client is served
        import aiohttp

        async with aiohttp.ClientSession() as http, \
                http.ws_connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            first = json.loads((await ws.receive(timeout=10)).data)
            assert first["type"] == "session.created", first
        assert time.perf_counter() - t0 < 60
    finally:
        await agent.runner.cleanup()


async def test_a_client_that_stops_reading_while_its_mic_streams_gives_its_slot_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message received resets aiohttp's heartbeat, so a client whose mic streams on
    while it reads nothing was never timed out: it kept its slot for as long as it sent.
    A send blocked SEND_DEADLINE_S (here 2 s) now ends its session."""
    from voice_agent.conversation import outbox

    monkeypatch.setattr(outbox, "SEND_DEADLINE_S", 2.0)
    agent = await serve(settings(ws_max_sessions=1))
    stop = threading.Event()
    try:
        port = int(agent.http.rsplit(":", 1)[1])
        client = asyncio.create_task(asyncio.to_thread(stop_reading_and_stream_on, port, stop))
        async with asyncio.timeout(5):
            while not agent.hub.talking:
                await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        async with asyncio.timeout(20):
            while agent.hub.talking:
                await asyncio.sleep(0.05)
        assert not client.done()  # freed while the client still streamed
        assert time.perf_counter() - t0 < 15
    finally:
        stop.set()
        await agent.runner.cleanup()
    assert await client > 0


async def test_the_sdks_beta_client_connects_with_websocket_base_url() -> None:
    """The README's line for the beta client: it makes `wss://` of any base_url, so it
    is given `websocket_base_url` (ws://) as well, and then talks beta events."""
    import openai

    agent = await serve(settings())
    try:
        http = agent.http
        c = openai.AsyncOpenAI(base_url=f"{http}/v1", api_key="none",
                               websocket_base_url=http.replace("http://", "ws://") + "/v1")
        async with c.beta.realtime.connect(model="voice-agent") as conn:
            ev = await asyncio.wait_for(conn.recv(), 10)
            assert ev.type == "session.created"
            await conn.session.update(session={"instructions": "Be brief."})
            ev = await asyncio.wait_for(conn.recv(), 10)
            assert ev.type == "session.updated" and ev.session.instructions == "Be brief."
    finally:
        await agent.runner.cleanup()
