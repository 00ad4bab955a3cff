"""WebSocket transport: one conversation per connection, no LiveKit (`GET /v1/talk`).

The agent's HTTP server (AGENT_HTTP_PORT) serves it in `serve-direct` (the local mesh)
and in the worker mode. Each connection is the conversation every door runs
(conversation/core.py: plugins, Silero VAD, duplex controller, fallback, transcript
synchronizer) with `SocketInput` / `socket_output` in place of room tracks.

The protocol (its messages, fields, close codes and limits) is protocol.json, the one
description that this package and the page (services/token/web/src/talk.js) both load.
By what a change touches:
  protocol.py  the file as code: names, parsing the client, checking what is sent
  audio.py     the socket's audio: mic frames in, paced reply frames out, the sender
  session.py   one conversation: the pipeline, its turns' events, the client's messages
  hub.py       the route: origin, key, admission, the hello, voices, starter phrases

Not here: authentication beyond the API key (bind AGENT_HTTP_HOST to loopback or put an
authenticating proxy in front), and any knowledge of the page that uses it.
"""

from .hub import TALK_HUB, TalkHub
from .protocol import PATH, VOICES_PATH

__all__ = ["PATH", "TALK_HUB", "VOICES_PATH", "TalkHub"]
