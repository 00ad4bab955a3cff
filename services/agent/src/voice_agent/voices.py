"""The TTS's voices, as the agent sees them: its presets and its voice library's voices.

The agent never keeps a list of its own: a voice is a name the TTS knows (ListVoices, on
AGENT_TTS_ADDR), so a voice made in the TTS's library (`POST /v1/audio/voices`, gRPC
CreateVoice) is usable by name at once, as AGENT_TTS_VOICE or as one conversation's
`voice` (talk/hub.py). Names compare case-insensitively, as the TTS compares them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .settings import AgentSettings

log = logging.getLogger("voice_agent.voices")

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the TTS's own rule for a voice's name
LIST_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Voice:
    name: str
    kind: str  # "preset", "clone" or "design" (a TTS older than the library: "preset")
    languages: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "languages": list(self.languages)}


class VoicesUnavailable(Exception):
    """The TTS did not answer ListVoices (down, starting, or refusing the key)."""


async def list_voices(settings: AgentSettings, timeout_s: float = LIST_TIMEOUT_S) -> list[Voice]:
    """ListVoices on the TTS; VoicesUnavailable (with the TTS's reason) if it fails."""
    key = settings.tts_api_key.get_secret_value()
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    try:
        async with grpc.aio.insecure_channel(settings.tts_addr) as ch:
            resp = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(
                tts_pb2.ListVoicesRequest(), timeout=timeout_s, metadata=metadata)
    except grpc.aio.AioRpcError as e:
        raise VoicesUnavailable(f"the TTS at {settings.tts_addr} did not list its voices: "
                                f"{e.code().name}: {e.details()}") from None
    except TimeoutError:
        raise VoicesUnavailable(f"the TTS at {settings.tts_addr} did not answer in "
                                f"{timeout_s:.0f} s") from None
    return [Voice(v.name, v.kind or "preset", tuple(v.languages)) for v in resp.voices]


def find(voices: list[Voice], name: str) -> Voice | None:
    """The voice called `name`, in any case; None if the TTS has none of that name."""
    low = name.lower()
    return next((v for v in voices if v.name.lower() == low), None)


def not_found_message(name: str, voices: list[Voice], addr: str) -> str:
    names = ", ".join(v.name for v in voices[:40]) + (" ..." if len(voices) > 40 else "")
    return (f"voice {name[:64]!r} is not one of the TTS's voices (at {addr}: {names or 'none'}); "
            "make it in the TTS's voice library (POST /v1/audio/voices, or `python -m "
            "voice_tts.client voices create`) or pick one of those")


class UnknownVoice(ValueError):
    """A voice the TTS does not list; the message names those it does."""


async def resolve(settings: AgentSettings, name: str, door: str) -> str:
    """The TTS's name for voice `name` (its case), for one conversation of `door`. A voice
    it does not list raises UnknownVoice; when the TTS does not answer, the name goes
    through as asked (its replies fail as any reply does while the TTS is down)."""
    try:
        voices = await list_voices(settings)
    except VoicesUnavailable as e:
        log.warning("%s: voice %r not checked: %s", door, name, e)
        return name
    voice = find(voices, name)
    if voice is None:
        raise UnknownVoice(not_found_message(name, voices, settings.tts_addr))
    return voice.name


async def check_configured_voice(settings: AgentSettings, *,
                                 quiet_unavailable: bool = False) -> bool | None:
    """At start-up: is AGENT_TTS_VOICE a voice of the TTS? Logs an error naming the fix
    when it is not (every reply would fail NOT_FOUND). None: the TTS did not answer
    (a warning unless `quiet_unavailable`: the caller asks again)."""
    try:
        voices = await list_voices(settings)
    except VoicesUnavailable as e:
        if not quiet_unavailable:
            log.warning("AGENT_TTS_VOICE=%r not checked: %s", settings.tts_voice, e)
        return None
    voice = find(voices, settings.tts_voice)
    if voice is None:
        log.error("AGENT_TTS_VOICE: %s. Until it exists every reply fails (NOT_FOUND) and "
                  "the agent stays silent", not_found_message(settings.tts_voice, voices,
                                                              settings.tts_addr))
        return False
    log.info("voice %r (%s) on the TTS at %s", voice.name, voice.kind, settings.tts_addr)
    return True
