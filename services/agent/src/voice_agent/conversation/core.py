"""One conversation, whatever the door (`Conversation`): the session and its parts
(agent.py `build_pipeline`: the ear, thinker, TTS, VAD and end-of-turn policy), the duplex
controller (barge-in and backchannels), the turn tracker, and the door's audio: a mic the
session hears, a paced speaker it plays to and the reply's words released in step with
that audio (a transcript synchronizer); or a LiveKit room's tracks. It starts and closes
the same way for every door, and owns the door's background work, so nothing a
conversation started outlives it.

    conv = Conversation(settings, mic=mic, speaker=speaker, captions=captions)
    await conv.start()                      # or start(room=...) for a LiveKit job
    conv.when_heard(text, say_transcript)   # the user's words, once the ear has them
    await conv.aclose()

A door that sets its conversation's options (the Realtime API's session.update:
instructions, voice, modalities, token limit, temperature, tools, turn detection) applies
them here (`configure`, or `start_soon` with the first), and a reply may carry its own
(`set_reply`, `restore` at its end). Its user turns and replies, item by item, are
user_turns.py's and replies.py's.

The doors (talk/, realtime/, direct.py, worker.py) map their wire onto it: the session's
own verbs (commit_user_turn, clear_user_turn, generate_reply, interrupt) and events
(state, conversation items, speech created) are the conversation's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from livekit import rtc
from livekit.agents.voice import io
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from ..agent import OnUserTurn, PhraseCache, Pipeline, attach_duplex, build_pipeline
from ..audio_io import MicrophoneInput, SpeakerOutput
from ..duplex import DuplexController
from ..metrics import TurnTracker
from ..settings import AgentSettings
from .mic import MicInput
from .options import Options, TurnDetection, client_tool
from .speaker import SocketSpeaker
from .turn_end import TurnEnd, eagerness_scale, endpointing

log = logging.getLogger("voice_agent.conversation")


class Conversation:
    """See the module. `mic`/`speaker`/`captions`: the door's audio in, audio out and
    reply words out (none of them: a LiveKit room's, given to `start`); `sample_rate`:
    the reply audio's where the door fixes it; `on_user_turn`: agent.py's OnUserTurn;
    `reports_first_audio`: the duplex controller reports the reply's first audio (a door
    whose speaker reports the write to its socket says False)."""

    def __init__(self, settings: AgentSettings, *, tracker: TurnTracker | None = None,
                 cache: PhraseCache | None = None,
                 mic: MicInput | MicrophoneInput | None = None,
                 speaker: SocketSpeaker | SpeakerOutput | None = None,
                 captions: io.TextOutput | None = None, sample_rate: int | None = None,
                 on_user_turn: OnUserTurn | None = None,
                 reports_first_audio: bool = True) -> None:
        self.settings = settings
        self.pipeline: Pipeline = build_pipeline(settings, tracker=tracker, cache=cache,
                                                 sample_rate=sample_rate,
                                                 on_user_turn=on_user_turn)
        self.tracker = self.pipeline.tracker
        self.mic = mic
        self.speaker = speaker
        # the reply's words leave as its paced audio plays (after a cut, none of the rest)
        self._sync = (TranscriptSynchronizer(next_in_chain_audio=speaker,
                                             next_in_chain_text=captions)
                      if speaker is not None else None)
        self.duplex: DuplexController = attach_duplex(
            self.pipeline, silent_from=speaker.silent_from if speaker is not None else None,
            reports_first_audio=reports_first_audio)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.own_tools = list(self.pipeline.agent.tools)  # AGENT_TOOLS: run here
        s = settings
        self.options = Options(instructions=s.system_prompt, voice=s.tts_voice,
                               temperature=s.llm_temperature,
                               turn_detection=self.agent_turn())

    def agent_turn(self) -> TurnDetection:
        """The agent's own turn detection (AGENT_VAD_*): a door's unset values."""
        s = self.settings
        return TurnDetection(threshold=s.vad_activation_threshold,
                             silence_duration_ms=s.vad_silence_ms)

    async def configure(self, options: Options) -> None:
        """A door's options, on the conversation's parts and end-of-turn policy."""
        self.options = o = options
        p, s = self.pipeline, self.settings
        p.tts.update_options(voice=o.voice)
        p.llm.update_options(temperature=o.temperature)
        self.restore(tools=False)
        await p.agent.update_instructions(o.instructions)
        await self.set_tools(o.tools)
        td = o.turn_detection
        if td is None:  # the client commits its turns (the mic then feeds no session)
            p.session.update_options(turn_detection="manual")
            return
        lo, hi = endpointing(s, td.eagerness)
        if isinstance(p.turn, TurnEnd):  # its own waits (a word or two's) scale alike
            p.turn.scale = eagerness_scale(td.eagerness)
        p.session.update_options(turn_detection=p.turn,  # type: ignore[arg-type]
                                 endpointing_opts={"min_delay": lo, "max_delay": hi})
        p.vad.update_options(
            min_silence_duration=(td.silence_duration_ms or s.vad_silence_ms) / 1000,
            activation_threshold=td.threshold or s.vad_activation_threshold)
        self.duplex.allow_interruptions = td.interrupt_response and s.allow_interruptions

    def set_reply(self, modalities: tuple[str, ...], max_tokens: int | None) -> None:
        """One reply's modalities and token limit (`restore` brings the options back)."""
        self.set_audio_enabled("audio" in modalities)
        self.pipeline.llm.update_options(max_tokens=max_tokens or self.settings.llm_max_tokens)

    def restore(self, tools: bool) -> None:
        """After a reply that had its own: the options' modalities, token limit and
        (`tools`) tools again."""
        self.set_reply(self.options.modalities, self.options.max_output_tokens)
        if tools:
            self.spawn(self.set_tools(self.options.tools))

    async def set_tools(self, client_tools: list[dict[str, Any]]) -> None:
        """The agent's own tools and a client's (its calls end the reply)."""
        await self.pipeline.agent.update_tools([*self.own_tools,
                                                *map(client_tool, client_tools)])

    async def start(self, room: rtc.Room | None = None) -> None:
        """The session starts listening (and greets, if the settings say so)."""
        p = self.pipeline
        if self.mic is not None:
            p.session.input.audio = self.mic
        if self._sync is not None and self.speaker is not None:
            p.session.output.audio = self._sync.audio_output
            p.session.output.transcription = self._sync.text_output
            self.speaker.start()
        if room is not None:
            await p.session.start(agent=p.agent, room=room)
        else:
            await p.session.start(agent=p.agent, record=False)

    def set_audio_enabled(self, on: bool) -> None:
        """Replies spoken, or text only (their words then go out as they are made)."""
        self.pipeline.session.output.set_audio_enabled(on)
        if self._sync is not None:
            self._sync.set_enabled(on)

    def start_soon(self, options: Options,
                   failed: Callable[[], None]) -> asyncio.Task[None]:
        """`start`, then `configure(options)`, in the background: a door answers its client
        at once and its verbs await the task. A conversation that cannot start serves
        nothing: logged, `failed()` (the door says so and ends), and the task raises."""
        async def run() -> None:
            try:
                await self.start()
                await self.configure(options)
            except Exception:
                log.exception("the conversation did not start")
                failed()
                raise

        return asyncio.create_task(run(), name="conversation-start")

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "conversation"
              ) -> asyncio.Task[Any]:
        """A door's background work for this conversation: cancelled when it closes."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def when_heard(self, text: str, then: Callable[[str], None]) -> None:
        """`then(words)` with a user turn's words: now, or, where the turn's text is the
        ear's utterance marker (AGENT_STT_MODE=audio), once the ear has written them, off
        the reply's path."""
        store = self.pipeline.stt.utterances
        if store is None or store.get(text) is None:
            then(text)
            return

        async def heard() -> None:
            then(await store.wait_words(text))

        self.spawn(heard(), name="conversation-words")

    async def aclose(self) -> None:
        """The session, its replies, the door's background work and every part stop
        here: no thinker or TTS work outlives the conversation."""
        if self.mic is not None:
            self.mic.close()
        p = self.pipeline
        try:
            await p.session.aclose()
        finally:
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._sync is not None:
                await self._sync.aclose()  # else its segment tasks outlive the session
            if self.speaker is not None:
                await self.speaker.aclose()
            for part in (p.stt, p.llm, p.tts):
                try:
                    await part.aclose()
                except Exception:  # one part failing to close must not keep the others
                    log.exception("closing %s failed", type(part).__name__)
