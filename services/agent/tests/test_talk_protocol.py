"""The page and the agent agree on `/v1/talk`: both take it from protocol.json, every
message type the server sends is handled by the page, every one the page sends is handled
by the server, and the messages each side builds are ones the other accepts.

The page's side runs under node (web/src/talk.js as the page bundles it); its handlers are
read from the page's source (`ev.type === '...'`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from voice_agent.duplex import DuplexState
from voice_agent.marks import LATENCY_KEYS
from voice_agent.talk import protocol
from voice_agent.talk.protocol import SPEC, Client, Server, problems

TALK = Path(protocol.__file__).parent
WEB = Path(__file__).resolve().parents[2] / "token" / "web"
EXAMPLE = {"int": 24000, "number": 12.5, "string": "x", "bool": False,
           "state": SPEC["states"][0], "role": SPEC["roles"][0], "error": "busy"}


def example(side: str, type_: str) -> dict[str, object]:
    """A well-formed message of the type, every field set, from the file alone."""
    fields = SPEC[side][type_]["fields"]
    return {"type": type_, **{k: EXAMPLE[kind.rstrip("?")] for k, kind in fields.items()}}


def server_source() -> str:
    """The talk route's code and the door it shares (whose refusals are its errors)."""
    door = TALK.parent / "conversation" / "door.py"
    return "\n".join(p.read_text() for p in [*sorted(TALK.glob("*.py")), door])


def page_source() -> str:
    return "\n".join(p.read_text() for p in sorted((WEB / "src").glob("*.js")))


def node_page(examples: list[dict[str, object]]) -> dict[str, object]:
    """What the page's talk.js builds and accepts, run under node."""
    node = shutil.which("node")
    assert node, "node (>= 20) is required: the page's side of the protocol runs under it"
    script = """
import * as talk from './src/talk.js';
import { LATENCY_FIELDS } from './src/latency.js';
const examples = JSON.parse(process.argv[1]);
console.log(JSON.stringify({
  start: talk.startMessage(48000, 'alice'), startPlain: talk.startMessage(16000),
  stop: talk.stopMessage(), handled: Object.keys(talk.HANDLED), rates: talk.INPUT_RATES,
  close: talk.CLOSE, latency: LATENCY_FIELDS,
  accepted: examples.map((m) => talk.parseEvent(JSON.stringify(m)) !== null),
}));
"""
    r = subprocess.run([node, "--input-type=module", "-e", script, json.dumps(examples)],
                       cwd=WEB, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_server_sends_and_handles_every_type_in_the_file() -> None:
    src = server_source()
    assert {t.value for t in Server} == set(SPEC["server"])
    assert {t.value for t in Client} == set(SPEC["client"])
    for t in Server:  # each one is sent somewhere
        assert f"Server.{t.name}" in src, f"the server never sends {t.value!r}"
    for t in Client:  # each one is read somewhere
        assert f"Client.{t.name}" in src, f"the server never reads {t.value!r}"
    # the states it sends are the duplex controller's, all of them
    assert {s.value for s in DuplexState} == set(SPEC["states"])
    # no message built by hand (a dict literal or a keyword, not `f"{{...}}"` prose)
    assert not re.search(r"""(?<!\{)\{\s*["']type["']\s*:\s*["']|type=["']""", src)


def test_the_servers_error_codes_are_the_files() -> None:
    raised = set(re.findall(r"""(?:ProtocolError|error_event|Refused)\(\s*["'](\w+)["']""",
                            server_source()))
    assert raised == set(SPEC["errors"]), (raised ^ set(SPEC["errors"]))
    with pytest.raises(ValueError, match=r"not in protocol\.json"):
        protocol.ProtocolError("made_up", "x")


def test_the_server_refuses_to_send_what_the_file_does_not_describe() -> None:
    for t in Server:
        msg = example("server", t.value)
        assert json.loads(protocol.server_message(t, **{k: v for k, v in msg.items()
                                                        if k != "type"})) == msg
    with pytest.raises(ValueError, match="unknown field 'extra'"):
        protocol.server_message(Server.CLEAR, extra=1)
    with pytest.raises(ValueError, match="missing field 'state'"):
        protocol.server_message(Server.STATE)
    with pytest.raises(ValueError, match="not a role"):
        protocol.server_message(Server.TRANSCRIPT, role="bot", text="x", interrupted=False)
    # the latency event is the worker's record, field for field
    assert tuple(SPEC["server"]["latency"]["fields"]) == LATENCY_KEYS


def test_the_page_handles_every_server_type_and_sends_only_client_types() -> None:
    examples = [example("server", t) for t in SPEC["server"]]
    page = node_page(examples)
    # every type the server sends has a handler on the page, and it accepts a
    # well-formed one; the page handles no type the server does not send
    assert set(page["handled"]) == set(SPEC["server"])
    assert all(page["accepted"]), dict(zip(SPEC["server"], page["accepted"], strict=True))
    acted_on = set(re.findall(r"""\.type === '(\w+)'""", page_source()))
    assert acted_on == set(SPEC["server"]), acted_on ^ set(SPEC["server"])
    # what the page sends: client types, well-formed, and the server takes them
    for text in (page["start"], page["startPlain"], page["stop"]):
        assert problems("client", json.loads(text)) == [], text
    assert protocol.parse_start(page["start"]) == (48000, "alice")
    assert protocol.parse_start(page["startPlain"]) == (16000, None)
    protocol.expect_stop(page["stop"])
    sent = set(re.findall(r"""JSON\.stringify\(\{ type: '(\w+)'""", page_source()))
    assert sent == set(SPEC["client"]), sent
    # the same rates, close codes and latency fields
    assert tuple(page["rates"]) == protocol.INPUT_RATES
    assert page["close"] == SPEC["close_codes"]
    assert set(page["latency"]) <= set(SPEC["server"]["latency"]["fields"])


def test_the_page_bundles_the_file_the_agent_loads() -> None:
    imports = re.findall(r"""from '([^']+\.json)'""", (WEB / "src" / "talk.js").read_text())
    assert [(WEB / "src" / p).resolve() for p in imports] == [TALK / "protocol.json"]
    build = (WEB / "build.sh").read_text()
    assert "agent/src/voice_agent/talk/protocol.json" in build  # a change rebuilds the page
