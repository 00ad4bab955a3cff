"""The scheduler: who runs in this engine step, and who ends after it. CPU bookkeeping
only, no tensors (testable without a model).

It owns the open sessions and their slots. `schedule()` looks at each session's head
utterance and returns a plain `SchedulerOutput`; the engine executes it (prompts, then one
batched step); `update(rows, tokens)` counts the step's frames and marks the utterances
that end with it (codec EOS, frame cap). Policy:

- prompts first (they start audio: TTFA), at most `max_prefills_per_step`, oldest text
  first; a prompt is ready once its first text token is *stable* (a word followed by
  a space or punctuation, or flush: `text.TextStream`) and some non-whitespace text has
  arrived; offline (`non_streaming_mode`) prompts wait for the flush. An in-context clone's
  prompt lays the text over its reference's codec rows (the official layout), so it waits
  for Ly - Lr text ids (reference frames + 1 minus transcript ids) or the flush: with
  live text its first audio comes later than a preset's; x-vector clones and designed
  voices start from the first id like presets;
- then ONE batched step over every running utterance that can make its next frame
  (continuous batching: sessions join and leave between steps), up to `max_batch` rows,
  least recently stepped first so nobody starves. A fresh prompt joins the step of its
  own iteration while there is room: its first step only completes and decodes the
  frame its prompt began (no talker, no text: speech from the first word). Every later
  step feeds the talker the next text-track id, so it waits until that id is known or
  the text is flushed;
- paused sessions (their reader is behind) and utterances whose last audio is still
  being decoded wait.

It knows the text track's layout (`text.TextIds`) but nothing of gRPC or audio.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from .api import EngineFull, EngineSettings
from .config import ModelConfig
from .layout import PrefillRequest
from .length_guard import max_frames_for
from .sampling import SamplingParams
from .session import Session, Utterance
from .text import TextIds


def text_index(s: Session, k: int) -> int:
    """The index into the text ids of the text-track id that talker step k feeds (k = 0:
    the prompt's last; negative: in an in-context clone's reference transcript)."""
    icl = s.voice.icl
    return k if icl is None else icl.codec_len + k - 1 - len(icl.ref_ids)


def text_chars_read(row: Row, frames: int) -> int:
    """Characters of the utterance's text (as pushed) the talker had read when it made
    its first `frames` frames: frame k comes from text ids 0..text_index(k) (one per
    step). Offline prompts hold the whole text: all of it. A few integer operations (the
    packet hot path)."""
    s, utt = row
    if s.params.non_streaming_mode:
        return utt.stream.chars
    return utt.stream.chars_read(text_index(s, frames - 1) + 1)


class Need(Enum):
    NOTHING = 0  # idle, paused, or waiting for text
    PREFILL = 1  # has enough text for its prompt
    DECODE = 2  # running, next text-track token known
    END_EMPTY = 3  # flushed with no speakable text: end at once


class Row(NamedTuple):
    """A session's head utterance: one row of a prompt batch or a decode step."""

    session: Session
    utt: Utterance


@dataclass
class SchedulerOutput:
    cancelled: list[Row] = field(default_factory=list)  # dropped: their "cancelled" end
    end_empty: list[Row] = field(default_factory=list)  # flushed with nothing to say
    prefill: list[Row] = field(default_factory=list)
    # The batched step: running rows, then fresh prompts (of `prefill`) joining it.
    decode: list[Row] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)  # each decode row's next text id
    talk: list[bool] = field(default_factory=list)  # False: the row's first step

    @property
    def idle(self) -> bool:
        return not (self.prefill or self.decode or self.end_empty)

    def launchable(self) -> tuple[list[Row], list[int], list[bool]]:
        """The decode rows that can step (a fresh prompt that failed or did not fit its
        slot drops out), their text ids and talk flags."""
        keep = [i for i, row in enumerate(self.decode) if row.utt.running]
        return ([self.decode[i] for i in keep], [self.text_ids[i] for i in keep],
                [self.talk[i] for i in keep])


class Scheduler:
    def __init__(self, settings: EngineSettings, cfg: ModelConfig) -> None:
        self.settings, self.cfg = settings, cfg
        self.max_batch = settings.max_batch if settings.batch_decode else 1
        self._lock = threading.Lock()
        self.sessions: dict[int, Session] = {}
        self.free_slots = list(range(settings.max_sessions - 1, -1, -1))
        self._next_id = 0

    # --- sessions (any thread) -------------------------------------------------------------

    def add(self, new: Callable[[int, int], Session]) -> Session:
        """`new(session_id, slot)` on a free slot; EngineFull when every slot is taken."""
        with self._lock:
            if not self.free_slots:
                raise EngineFull(f"engine full: {self.settings.max_sessions} sessions active")
            session = new(self._next_id, self.free_slots.pop())
            self._next_id += 1
            self.sessions[session.id] = session
            return session

    def remove(self, session: Session) -> None:
        # Safe while a step of this slot may still be in flight: the engine thread is the
        # only writer of the caches, a new owner's prompt rewrites the rows it will read,
        # and stale rows past a query's position are masked.
        with self._lock:
            if self.sessions.pop(session.id, None) is not None:
                self.free_slots.append(session.slot)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self.sessions)

    def open_sessions(self) -> list[Session]:
        with self._lock:
            return list(self.sessions.values())

    # --- the step (engine thread) ----------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        ready: list[tuple[float, int, Need, Row, TextIds]] = []
        for s in self.open_sessions():
            out.cancelled += [Row(s, utt) for utt in s.take_dropped()]
            utt = s.head()
            if utt is None or utt.cancelled:
                continue
            text = utt.stream.ids()
            need = self.need(s, utt, text)
            if need is not Need.NOTHING:
                ready.append((utt.last_active or utt.created, s.id, need, Row(s, utt), text))
        ready.sort(key=lambda r: r[:2])
        out.end_empty = [row for _, _, need, row, _ in ready if need is Need.END_EMPTY]
        prompts = [(row, text) for _, _, need, row, text in ready if need is Need.PREFILL]
        steps = [(row, text) for _, _, need, row, text in ready if need is Need.DECODE]
        prompts, steps = prompts[:self.settings.max_prefills_per_step], steps[:self.max_batch]
        out.prefill = [row for row, _ in prompts]
        # Fresh prompts take their first step now, not one iteration later (TTFA).
        for row, text in steps + prompts[:self.max_batch - len(steps)]:
            out.decode.append(row)
            out.talk.append(row.utt.steps > 0)
            out.text_ids.append(self.next_text_id(row, text))
        return out

    def need(self, s: Session, utt: Utterance, text: TextIds) -> Need:
        if s.paused:  # its reader is behind: no new audio until it catches up
            return Need.NOTHING
        if utt.ending is not None:  # its last frame is still being decoded
            return Need.NOTHING
        if not utt.running:
            if text.finished and not utt.stream.has_content:
                return Need.END_EMPTY
            if s.params.non_streaming_mode:
                return Need.PREFILL if text.finished else Need.NOTHING
            ready = text.finished or len(text.text) >= max(1, self._prompt_ids(s))
            return Need.PREFILL if utt.stream.has_content and text.text and ready \
                else Need.NOTHING
        return Need.DECODE if self._ready_to_step(Row(s, utt), text, utt.steps) \
            else Need.NOTHING

    @staticmethod
    def _prompt_ids(s: Session) -> int:
        """Text ids a streaming prompt takes: the first (presets, x-vector clones,
        designs); an in-context clone's, those under its reference's codec track
        (Ly - Lr: with live text its first audio waits for them, or for the flush)."""
        icl = s.voice.icl
        return 1 if icl is None else max(0, icl.codec_len - len(icl.ref_ids))

    def _ready_to_step(self, row: Row, text: TextIds, steps: int) -> bool:
        """It can make its next frame after `steps` steps: the first needs no text (its
        prompt began the frame); step k feeds the text-track id after the prompt's,
        known or flushed."""
        if steps == 0 or row.session.params.non_streaming_mode or text.finished:
            return True
        return self._track_id(row.session, text, steps) is not None

    def next_text_id(self, row: Row, text: TextIds) -> int:
        """The text-track id of the row's next talker step (offline prompts hold the
        whole text: pad only; a first step: unused, pad)."""
        if row.session.params.non_streaming_mode or row.utt.steps == 0:
            return self.cfg.tts_pad_token_id
        return self._track_id(row.session, text, row.utt.steps)

    def _track_id(self, s: Session, text: TextIds, k: int) -> int | None:
        """Streaming text track X = [reference ids (in-context clones)] + text ids +
        tts_eos, then tts_pad. The prompt holds X up to the first text id (or, in-context,
        X[:Ly]); talker step k >= 1 feeds the id after it: X[k], in-context X[Ly + k - 1].
        None: not known yet."""
        j, icl = text_index(s, k), s.voice.icl
        if icl is not None and j < 0:  # still in the reference transcript
            return icl.ref_ids[j]
        if j < len(text.text):
            return text.text[j]
        if not text.finished:
            return None
        return self.cfg.tts_eos_token_id if j == len(text.text) else self.cfg.tts_pad_token_id

    def prompt(self, row: Row) -> tuple[PrefillRequest, SamplingParams, int]:
        """The row's prompt (streaming: the text ids it takes; offline: all of them), its
        sampling parameters and the noise seed of its utterance."""
        s, text = row.session, row.utt.stream.ids()
        v = s.voice
        req = PrefillRequest(
            slot=s.slot, role_ids=text.role, codec_prefix=v.codec_prefix,
            speaker_id=v.speaker_id, speaker_vec=v.speaker_vec, icl=v.icl,
            text_ids=text.text if s.params.non_streaming_mode else
            text.text[:self._prompt_ids(s)],
            non_streaming=s.params.non_streaming_mode, instruct_ids=s.instruct_ids)
        return req, s.params.sampling, s.next_seed()

    def started(self, rows: list[Row], lengths: list[int], t0: float, t1: float) -> None:
        """Their prompts ran (from t0 to t1, perf_counter): they step from now on."""
        for (_, utt), length in zip(rows, lengths, strict=True):
            utt.running, utt.prompt_len, utt.last_active = True, length, t1
            first = utt.first_text or utt.created
            utt.timings = {"queue_ms": (t0 - first) * 1e3, "prefill_ms": (t1 - t0) * 1e3}

    def update(self, rows: list[Row], tokens: list[int]) -> None:
        """A step's codebook-0 tokens, one per row: the frame it made (counted), or codec
        EOS (no frame: the utterance is over); mark the utterances that end with it
        (`ending`: they end once its audio is out)."""
        eos = self.cfg.talker.codec_eos_token_id
        codes = self.cfg.speech_decoder.codebook_size
        # The graphed step indexes without checks: a sampled id past the speech decoder's
        # codebooks (a sampler bug) fails the step loudly here, not silently in audio.
        bad = [(s.slot, t) for (s, _), t in zip(rows, tokens, strict=True)
               if not (0 <= t < codes or t == eos)]
        if bad:
            raise IndexError(f"sampled codebook-0 ids outside the speech decoder's {codes} "
                             f"codes and EOS (slot, id): {bad}")
        now = time.perf_counter()
        for (s, utt), token in zip(rows, tokens, strict=True):
            if utt.cancelled:
                continue
            utt.steps += 1
            utt.last_active = now
            if token == eos:
                utt.ending = "eos"
            elif utt.steps >= self.limit(s, utt):
                utt.ending = "max_frames"

    def limit(self, s: Session, utt: Utterance) -> int:
        """The most frames this utterance may take (length_guard.py), within its slot."""
        st = self.settings
        if s.params.max_frames is not None:
            limit = s.params.max_frames
        else:  # the text received so far: the talker never runs ahead of it
            limit = min(st.max_frames, max_frames_for(
                utt.stream.length, st.max_frames_base, st.max_frames_per_char,
                st.max_frames_per_wide_char, st.max_frames_per_digit))
        return min(limit, st.max_seq_len - utt.prompt_len - 1)
