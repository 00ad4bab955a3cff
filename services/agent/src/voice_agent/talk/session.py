"""One conversation on one socket (`TalkSession`): the pipeline with the socket's audio
in place of room tracks, its turns' events (state, transcript, latency) to the client, and
the client's messages until it stops or goes: mic audio, `stop`, and `feedback` on the
latest end of turn (saved by the hub's FeedbackRecorder, feedback.py).

Admission and voices are the hub's (hub.py); framing and pacing the audio is audio.py's.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from aiohttp import WSMsgType, web

from ..agent import PhraseCache
from ..conversation.core import Conversation
from ..conversation.door import close_with, converse
from ..conversation.turn_end import Decision, TurnEnd
from ..duplex import DuplexState
from ..feedback import FeedbackRecorder
from ..metrics import TurnTracker
from ..settings import AgentSettings
from .audio import SocketCaptions, SocketInput, TalkOutbox, socket_output
from .protocol import (
    ENCODING,
    PROTOCOL,
    ROLES,
    Client,
    Close,
    ProtocolError,
    Server,
    check_audio,
    error_event,
    parse_running,
)

log = logging.getLogger("voice_agent.ws")

# The page's buttons in the recorder's words: "you cut me off" = the turn was not over.
VERDICTS = {"cut_off": "unfinished", "too_slow": "complete"}


class TalkSession:
    """One conversation on one socket: the pipeline, its I/O and its events."""

    def __init__(self, settings: AgentSettings, cache: PhraseCache,
                 ws: web.WebSocketResponse, input_rate: int,
                 recorder: FeedbackRecorder | None = None) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.settings = settings  # its tts_voice: this conversation's voice
        self.ws = ws
        self.recorder = recorder  # the hub's: where feedback goes (None, or disabled: off)
        self._saved: tuple[Decision, str] | None = None  # the last turn saved, its pair id
        self.outbox = TalkOutbox(ws, settings.tts_frame_ms / 1000, name=f"talk {self.id}")
        tracker = TurnTracker(on_report=lambda rec: self.outbox.event(Server.LATENCY, **rec))
        self.mic = SocketInput(input_rate)
        # the reply's first audio is the socket's to report (socket_output), its words
        # go out as captions while that audio plays
        self.conv = Conversation(
            settings, tracker=tracker, cache=cache, mic=self.mic,
            speaker=socket_output(self.outbox, sample_rate=settings.tts_sample_rate,
                                  frame_ms=settings.tts_frame_ms,
                                  on_first_audio=tracker.audio_published),
            captions=SocketCaptions(self.outbox), reports_first_audio=False)
        self.pipeline = p = self.conv.pipeline
        self.conv.duplex.on_state(lambda s: self.outbox.event(Server.STATE, state=s.value))
        p.session.on("conversation_item_added", self._on_item)
        self.outbox.event(Server.READY, protocol=PROTOCOL, session_id=self.id,
                          input_rate=input_rate, output_rate=settings.tts_sample_rate,
                          frame_ms=settings.tts_frame_ms, encoding=ENCODING,
                          voice=settings.tts_voice, feedback=self.takes_feedback)
        self.outbox.event(Server.STATE, state=DuplexState.LISTENING.value)

    @property
    def takes_feedback(self) -> bool:
        """Feedback is saved: a recorder, and a detector that keeps its decision."""
        return (self.recorder is not None and self.recorder.enabled
                and isinstance(self.pipeline.turn, TurnEnd))

    def _on_item(self, ev: object) -> None:
        item = getattr(ev, "item", None)
        if getattr(item, "type", None) != "message" or item.role not in ROLES:
            return
        role, interrupted = item.role, bool(item.interrupted)
        self.conv.when_heard(item.text_content or "", lambda words: self.outbox.event(
            Server.TRANSCRIPT, role=role, text=words, interrupted=interrupted))

    async def run(self, on_end: Callable[[], None] = lambda: None) -> None:
        """Until the client stops or goes, or a protocol error (raised after teardown).
        `on_end` runs as soon as either side has ended it, before the teardown."""
        async def say_why(receiver: asyncio.Task[None]) -> None:
            if (receiver.done() and not receiver.cancelled()
                    and isinstance(err := receiver.exception(), ProtocolError)):
                await refuse(self.ws, err)  # the client hears why now, not after teardown

        async def close() -> None:
            await self.conv.aclose()
            self.outbox.close()  # what the teardown said (a cut reply's words) goes out

        # listening at once: the starter phrases are the hub's (`TalkHub.prepare`)
        receiver = await converse(self.outbox, self._receive(), self.conv.start, close,
                                  on_end, f"talk-{self.id}", say_why)
        if not receiver.cancelled() and (err := receiver.exception()) is not None:
            raise err

    async def _receive(self) -> None:
        async for msg in self.ws:
            if msg.type == WSMsgType.BINARY:
                check_audio(msg.data, self.mic.input_rate)
                self.mic.push(msg.data)
            elif msg.type == WSMsgType.TEXT:
                message = parse_running(msg.data)
                if message["type"] == Client.STOP:
                    return
                await self._feedback(message.get("label"))
            elif msg.type == WSMsgType.ERROR:
                raise ProtocolError("too_large", str(self.ws.exception()), Close.TOO_LARGE)

    async def _feedback(self, label: object) -> None:
        """The user's verdict on the latest end of turn: saved (`feedback_saved`), or an
        error of KEPT_ERRORS; the conversation goes on either way."""
        turn = self.pipeline.turn
        decision = turn.last if isinstance(turn, TurnEnd) else None
        if not isinstance(label, str) or label not in VERDICTS:
            err = error_event("feedback_bad_label", f"feedback label {str(label)[:40]!r} is "
                              f"not one of {list(VERDICTS)}")
        elif not self.takes_feedback:
            err = error_event("feedback_disabled", self._feedback_off())
        elif decision is None:
            err = error_event("feedback_no_turn", "no turn to give feedback on: the agent "
                              "has not decided the end of a turn of this conversation yet")
        elif decision.audio is None or not len(decision.audio):
            err = error_event("feedback_no_audio", "the agent kept no audio of its latest "
                              "turn (its end of speech came too late); nothing saved")
        else:
            try:
                pair = await self._save(decision, VERDICTS[label])
            except Exception:
                log.exception("talk %s: feedback %s not saved", self.id, label)
                err = error_event("feedback_failed", "the agent could not save the feedback "
                                  "(its log says why)")
            else:
                log.info("talk %s: feedback %s saved as %s", self.id, label, pair)
                self.outbox.event(Server.FEEDBACK_SAVED, id=pair, label=label)
                return
        self.outbox.event(Server.ERROR, code=err["code"], message=err["message"])

    async def _save(self, decision: Decision, verdict: str) -> str:
        """One pair per turn: feedback on the turn saved last relabels its pair."""
        assert self.recorder is not None
        again = self._saved[1] if self._saved and self._saved[0] is decision else None
        pair = await self.recorder.save(decision, verdict, self.id, pair_id=again)
        self._saved = (decision, pair)
        return pair

    def _feedback_off(self) -> str:
        if self.recorder is None or not self.recorder.enabled:
            return "this agent saves no feedback (AGENT_FEEDBACK_DIR is not set)"
        return (f"this agent's end-of-turn detector (AGENT_TURN_DETECTION="
                f"{self.settings.turn_detection}) keeps no decision to save")


async def refuse(ws: web.WebSocketResponse, e: ProtocolError) -> None:
    """The client hears why (an error message), then the socket closes with its code."""
    await close_with(ws, error_event(e.code, e.message), e.close_code, e.code)
