"""Transports: how a case's user speech reaches the agent and its reply reaches the probe.

`direct` drives the agent's AgentSession in-process (no LiveKit); `livekit` runs the
user bot and probe bot in a real LiveKit room. Both return a `Capture`.
"""
