"""The shape of a token request, checked field by field with messages a person can act on.

Body: a JSON object `{"room": str, "identity": str, "name"?: str}` and nothing else.
Room and identity become LiveKit names and show up in URLs, logs and metric labels of
other services, so they are kept to a plain charset; `name` is a display name and may
be any printable text. Unknown fields are rejected rather than ignored so that a typo
(`"rom"`) fails loudly instead of minting a token for the wrong room.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

NAME_MAX = 64
DISPLAY_NAME_MAX = 64
MAX_BODY_BYTES = 4096
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ID_RULE = (
    f"1-{NAME_MAX} characters: letters, digits, '.', '_' or '-', starting with a letter or digit"
)
FIELDS = ("room", "identity", "name")


class RequestError(ValueError):
    """A client error: HTTP status plus a message safe to send back."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass(frozen=True)
class TokenRequest:
    room: str
    identity: str
    name: str | None = None


def parse_token_request(body: bytes) -> TokenRequest:
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"body too large (limit {MAX_BODY_BYTES} bytes)", status=413)
    if not body.strip():
        raise RequestError('empty body; send JSON like {"room": "demo", "identity": "alice"}')
    try:
        data = json.loads(body)
    except RecursionError:  # thousands deep; a token request nests 1
        raise RequestError("body is not valid JSON (nested too deep)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise RequestError(f"body is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RequestError(f"body must be a JSON object, got {_json_type(data)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r} (allowed: {', '.join(FIELDS)})", field=unknown[0]
        )
    room = _id_field(data, "room")
    identity = _id_field(data, "identity")
    name = _display_name(data.get("name"))
    return TokenRequest(room=room, identity=identity, name=name)


def _id_field(data: dict[str, object], field: str) -> str:
    if field not in data or data[field] is None:
        raise RequestError(f"missing field {field!r}", field=field)
    value = data[field]
    if not isinstance(value, str):
        raise RequestError(f"{field!r} must be a string, got {_json_type(value)}", field=field)
    if len(value) > NAME_MAX or not _ID_RE.fullmatch(value):
        raise RequestError(f"invalid {field} {_preview(value)}: use {_ID_RULE}", field=field)
    return value


def _display_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise RequestError(f"'name' must be a string, got {_json_type(value)}", field="name")
    value = value.strip()
    if not value:
        return None
    if len(value) > DISPLAY_NAME_MAX:
        raise RequestError(f"'name' is longer than {DISPLAY_NAME_MAX} characters", field="name")
    if not value.isprintable():
        raise RequestError("'name' contains control characters", field="name")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _preview(value: str) -> str:
    # Echo enough to recognise the input, not a 4 KiB blob.
    return repr(value if len(value) <= 40 else value[:40] + "...")
