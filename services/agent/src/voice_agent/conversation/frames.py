"""JSON text frames both ways, as every door's client sends and reads them."""

from __future__ import annotations

import json
from typing import Any


def wire_json(ev: dict[str, object]) -> str:
    """An event as a text frame. A client's JSON may escape a lone surrogate ("\\ud800"),
    and an error that quotes it then holds one: UTF-8 cannot carry it, and sending it
    raised in the sender and ended the session. Such an event goes escaped (ASCII)."""
    text = json.dumps(ev, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(ev)
    return text


def read_json(text: str) -> dict[str, Any]:
    """A client's text frame as a JSON object; a ValueError says why it is not one."""
    try:
        msg = json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # nested thousands deep: no message of ours nests so
        raise ValueError("JSON nested too deep") from None
    if not isinstance(msg, dict):
        raise ValueError("a message is a JSON object")
    return msg


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (RFC 8259): Python's parser takes them, and echoed
    back (a response's metadata) they broke a browser's JSON.parse."""
    raise ValueError(f"{name} is not a JSON value")
