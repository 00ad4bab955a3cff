"""The OpenAI Realtime API on the agent (`GET /v1/realtime`, beside `/v1/talk`): any
Realtime client (the `openai` SDK's `client.realtime.connect`, LiveKit's
`openai.realtime.RealtimeModel`, Pipecat) talks to our thinker, TTS and ear.

A door on the one conversation core (conversation/core.py: the AgentSession, its
end-of-turn policy and barge-in, shared with /v1/talk and LiveKit rooms). By what a
change touches:
  events.py   the wire: session shapes (GA and beta), event names, errors, G.711
  session.py  one session: the API's events over the conversation (turns, responses, the
              client's input buffer, client-run tools)
  items.py    the client's items, bounded, and as the thinker's context
  route.py    the door: origin, key and slots shared with /v1/talk (talk/hub.py)
"""

from .route import PATH, handle

__all__ = ["PATH", "handle"]
