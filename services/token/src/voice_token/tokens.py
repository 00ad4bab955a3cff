"""Minting LiveKit participant tokens, and nothing else.

A token lets one identity join one room (`room_join` for that room only: no room
create/list/admin, no recording) and publish/subscribe audio and data. When an agent
name is configured, the token carries a room configuration that dispatches that agent
into the room the first time a participant joins with it (LiveKit explicit dispatch).

This module knows nothing about HTTP, validation or rate limits: it trusts its inputs.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import jwt
from livekit.api import AccessToken, RoomAgentDispatch, RoomConfiguration, VideoGrants


@dataclass(frozen=True)
class IssuedToken:
    jwt: str
    expires_at: dt.datetime  # UTC, equal to the token's `exp` claim


@dataclass(frozen=True)
class TokenMinter:
    api_key: str
    api_secret: str
    ttl: dt.timedelta
    agent_name: str = ""

    def __repr__(self) -> str:  # never the secret, whatever prints this object
        return f"TokenMinter(api_key=<set>, ttl={self.ttl}, agent_name={self.agent_name!r})"

    def mint(self, room: str, identity: str, name: str | None = None) -> IssuedToken:
        grants = VideoGrants(
            room_join=True,
            room=room,
            can_publish=True,
            can_subscribe=True,
            can_publish_data=True,
            # The page publishes a microphone and nothing else.
            can_publish_sources=["microphone"],
        )
        token = (
            AccessToken(self.api_key, self.api_secret)
            .with_identity(identity)
            .with_grants(grants)
            .with_ttl(self.ttl)
            .with_kind("standard")
        )
        if name:
            token = token.with_name(name)
        if self.agent_name:
            token = token.with_room_config(
                RoomConfiguration(agents=[RoomAgentDispatch(agent_name=self.agent_name)])
            )
        encoded = token.to_jwt()
        # Read `exp` back from what we signed, so expires_at can never disagree with it.
        exp = jwt.decode(encoded, options={"verify_signature": False})["exp"]
        return IssuedToken(encoded, dt.datetime.fromtimestamp(exp, tz=dt.UTC))
