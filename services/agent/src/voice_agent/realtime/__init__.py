"""The OpenAI Realtime API on the agent (`GET /v1/realtime`, beside `/v1/talk`): any
Realtime client (the `openai` SDK, LiveKit's `openai.realtime.RealtimeModel`, Pipecat)
talks to our thinker, TTS and ear. A door on the one conversation core (conversation/):
  events.py   the wire: session shapes (GA and beta), event names, errors
  session.py  one session: the client's events as the conversation's verbs, its turns
              and replies as the API's events
  items.py    a client's items, and the session's bounds on them
  route.py    the door (conversation/door.py, shared with /v1/talk)
"""

from .route import PATH, handle

__all__ = ["PATH", "handle"]
