"""The `/v1/talk` protocol as code: protocol.json (which the page imports too) loaded once,
its names as enums, the client's messages parsed, the server's built and checked.

What the messages are, their fields, the close codes and the limits live in protocol.json
only; a name used here that the file lacks fails at its first use, and a message the file
does not describe is refused before it reaches the wire. Knows nothing of sessions, audio
or the pipeline.
"""

from __future__ import annotations

import json
from enum import IntEnum, StrEnum
from importlib import resources
from typing import Any

from ..conversation.frames import read_json
from ..voices import NAME

SPEC: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath("protocol.json").read_text(encoding="utf-8"))

PATH: str = SPEC["path"]
VOICES_PATH: str = SPEC["voices_path"]  # GET: the TTS's voices a conversation may ask for
PROTOCOL: int = SPEC["version"]
ENCODING: str = SPEC["encoding"]
INPUT_RATES: tuple[int, ...] = tuple(SPEC["input_rates"])
MAX_MESSAGE_MS: int = SPEC["limits"]["max_message_ms"]  # browsers send 3-100 ms
HELLO_TIMEOUT_S: float = float(SPEC["limits"]["hello_timeout_s"])
ROLES: tuple[str, ...] = tuple(SPEC["roles"])  # transcript roles
FEEDBACK_LABELS: tuple[str, ...] = tuple(SPEC["feedback_labels"])
KEPT_ERRORS: frozenset[str] = frozenset(SPEC["kept_errors"])  # the conversation goes on

# Generated from the file, so a type or code exists in one place: Client.START == "start".
Client = StrEnum("Client", {t.upper(): t for t in SPEC["client"]})  # type: ignore[misc]
Server = StrEnum("Server", {t.upper(): t for t in SPEC["server"]})  # type: ignore[misc]
Close = IntEnum("Close", {k.upper(): v for k, v in SPEC["close_codes"].items()})  # type: ignore[misc]

# A field's type in protocol.json -> whether a value has it ("?" also allows None).
_KINDS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "state": lambda v: v in SPEC["states"],
    "role": lambda v: v in SPEC["roles"],
    "error": lambda v: v in SPEC["errors"],
}


class ProtocolError(Exception):
    """Why the server ends a conversation: an error code of protocol.json's, its message
    for the client, the close code and the refusal metric's label."""

    def __init__(self, code: str, message: str, close_code: int = Close.POLICY,
                 reason: str | None = None) -> None:
        if code not in SPEC["errors"]:
            raise ValueError(f"error code {code!r} is not in protocol.json's errors")
        super().__init__(message)
        self.code, self.message, self.close_code = code, message, close_code
        self.reason = reason or code  # agent_ws_refused_total's label


def problems(side: str, msg: dict[str, object]) -> list[str]:
    """What is wrong with `msg` as a message of `side` ("client" or "server"): an unknown
    type, a field the file does not name, a missing or mistyped one. Empty: it is fine."""
    spec = SPEC[side].get(msg.get("type"))  # type: ignore[call-overload]
    if spec is None:
        return [f"unknown {side} message type {msg.get('type')!r}"]
    out = [f"unknown field {k!r}" for k in msg if k != "type" and k not in spec["fields"]]
    for name, kind in spec["fields"].items():
        value = msg.get(name)
        if value is None and kind.endswith("?"):
            continue
        if name not in msg:
            out.append(f"missing field {name!r}")
        elif not _KINDS[kind.rstrip("?")](value):
            out.append(f"field {name!r} is not a {kind}: {value!r}")
    return out


def server_event(type_: Server, **fields: object) -> dict[str, object]:
    """A server message. One the file does not describe is a bug here, not news for the
    page: it raises."""
    msg = {"type": str(type_), **fields}
    if bad := problems("server", msg):
        raise ValueError(f"{type_} message breaks protocol.json: {'; '.join(bad)}")
    return msg


def server_message(type_: Server, **fields: object) -> str:
    """A server message as sent on the socket."""
    return json.dumps(server_event(type_, **fields), ensure_ascii=False)


def error_event(code: str, message: str) -> dict[str, object]:
    """An error, on the socket or as an HTTP body (before the upgrade, GET /v1/voices)."""
    return server_event(Server.ERROR, code=code, message=message)


def parse_json(text: str) -> dict[str, object]:
    try:
        return read_json(text)
    except ValueError as e:
        raise ProtocolError("bad_json", f"text messages must be JSON objects: {e}",
                            Close.INVALID_JSON) from None


def parse_start(text: str) -> tuple[int, str | None]:
    """The client's first message -> its mic sample rate and the voice it asks for, if
    any (ProtocolError if bad; whether the TTS has that voice is the hub's question)."""
    msg = parse_json(text)
    if msg.get("type") != Client.START:
        raise ProtocolError("expected_start", f'the first message must be {{"type": "start", '
                            f'"sample_rate": N}}, got type {msg.get("type")!r}')
    rate = msg.get("sample_rate")
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in INPUT_RATES:
        raise ProtocolError("bad_sample_rate", f"sample_rate {rate!r} is not supported; "
                            f"use one of {list(INPUT_RATES)} (s16le mono)")
    voice = msg.get("voice")
    if voice is None or voice == "":
        return rate, None
    if not isinstance(voice, str) or not NAME.fullmatch(voice):
        raise ProtocolError("bad_voice", f"voice {str(voice)[:80]!r} is not a voice name "
                            "([A-Za-z0-9_-]{1,64}; GET /v1/voices lists them)")
    return rate, voice


def parse_running(text: str) -> dict[str, object]:
    """A text message once the conversation runs: `stop` or `feedback`, returned (its
    fields are the caller's to check: a bad feedback label does not end the
    conversation); ProtocolError on anything else."""
    msg = parse_json(text)
    kind = msg.get("type")
    if kind in (Client.STOP, Client.FEEDBACK):
        return msg
    if kind == Client.START:
        raise ProtocolError("duplicate_start", '"start" was already received')
    raise ProtocolError("unknown_type", f"unknown message type {kind!r}")


def expect_stop(text: str) -> None:
    """`text` is a `stop` message (ProtocolError if it is no message of a running
    conversation, ValueError if another one)."""
    if (kind := parse_running(text)["type"]) != Client.STOP:
        raise ValueError(f"expected stop, got {kind!r}")


def check_audio(data: bytes, rate: int) -> None:
    if len(data) % 2:
        raise ProtocolError("bad_audio", "binary messages are s16le PCM: an even byte count")
    limit = rate * MAX_MESSAGE_MS // 1000 * 2
    if len(data) > limit:
        raise ProtocolError("too_large", f"binary message of {len(data)} bytes: at most "
                            f"{MAX_MESSAGE_MS} ms of audio ({limit} bytes at {rate} Hz)",
                            Close.TOO_LARGE)
