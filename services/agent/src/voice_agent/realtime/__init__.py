"""The OpenAI Realtime API on the agent (`GET /v1/realtime`, beside `/v1/talk`): any
Realtime client (the `openai` SDK's `client.realtime.connect`, LiveKit's
`openai.realtime.RealtimeModel`, Pipecat) talks to our thinker, TTS and ear.

By what a change touches:
  events.py   the wire: session shapes (GA and beta), event names, errors, G.711
  session.py  one session: input buffer and server VAD, items, responses, barge-in
  route.py    the door: origin, key and slots shared with /v1/talk (talk/hub.py)
"""

from .route import PATH, handle

__all__ = ["PATH", "handle"]
