"""Output: what leaves the engine for the sessions' sinks. A step's decoded frames go out
as packets (`first_packet_frames`, then the ramp up to `packet_frames`: api.packet_ramp),
utterances end (`UtteranceEnd`), and `guard` turns engine work that raised into "error"
ends of the rows it touched, so the other sessions keep being served.

On CUDA with graphs a step's audio is read one iteration after its launch (its speech
decoder runs beside the next step): the step waits as an `InFlight`, and an utterance
that the scheduler marked `ending` ends when that last audio is out. A step that sampled
codec EOS made no frame: the packet before it may have gone out without `final` (the
end is known one step after the last frame), so the `UtteranceEnd` is what closes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .api import AudioPacket, EngineSettings, StepStats, UtteranceEnd, to_s16
from .faults import EngineFailed, poisons_device
from .runner import Step
from .scheduler import Row, text_chars_read

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A launched step whose audio is not out yet."""

    rows: list[Row]
    step: Step
    prefills: int  # prompts run in the iteration that launched it (for StepStats)


class Guard:
    ok = False  # the guarded work finished without raising


class Output:
    def __init__(self, settings: EngineSettings, fail: Callable[[BaseException], None],
                 codebook_size: int) -> None:
        self.settings = settings
        self.codebook_size = codebook_size  # a step's token past the codes (EOS): no frame
        self._fail = fail  # a fault that poisons the device: the engine stops for good
        self.faults = 0  # engine work that raised (each ended the utterances it touched)

    @contextmanager
    def guard(self, what: str, rows: list[Row]) -> Iterator[Guard]:
        """Run a piece of engine work for `rows`; if it raises, end their utterances
        ("error") and go on (`Guard.ok` stays False), or, for a fault that poisons the
        device, stop the engine (EngineFailed)."""
        g = Guard()
        try:
            yield g
            g.ok = True
        except Exception as exc:
            self.faults += 1
            if poisons_device(exc):
                self._fail(exc)
                raise EngineFailed(str(exc)) from exc
            log.exception("%s of sessions %s failed; ending their utterances", what,
                          [s.id for s, _ in rows])
            for row in rows:
                self.end(row, "error", f"{what} failed ({type(exc).__name__})")

    def cancelled(self, rows: list[Row]) -> None:
        """Utterances dropped by cancel / reset / close: their end goes out even so."""
        for s, utt in rows:
            s.emit(utt, UtteranceEnd(utt.id, utt.emitted, "cancelled"), always=True)

    def end_empty(self, rows: list[Row]) -> None:
        """Flushed with nothing to say: an end with no audio."""
        for s, utt in rows:
            s.finish_head(utt)
            s.emit(utt, UtteranceEnd(utt.id, 0, "eos"))

    def end(self, row: Row, reason: str, error: str = "") -> None:
        s, utt = row
        if utt.ended:  # e.g. a failed step ended it while its last step was in flight
            return
        utt.ended = True
        s.finish_head(utt, keep_open=reason in ("eos", "max_frames"))
        if not utt.cancelled:
            chars = (utt.stream.chars if reason == "eos" else
                     text_chars_read(row, utt.emitted) if reason == "max_frames" else 0)
            s.emit(utt, UtteranceEnd(utt.id, utt.emitted, reason, error,  # type: ignore[arg-type]
                                     chars))

    def deliver(self, flight: InFlight) -> StepStats | None:
        """The step's audio out as packets (and the ends it brings); its stats."""
        t0 = 0.0
        with self.guard("audio", flight.rows) as g:
            codes, pcm = flight.step.audio()
            tokens = flight.step.tokens()
            t0 = time.perf_counter()
            pcm16 = to_s16(pcm)
            for i, row in enumerate(flight.rows):
                utt = row.utt
                if utt.cancelled or utt.ended:
                    continue
                if tokens[i] < self.codebook_size:
                    utt.pending.append((codes[i], pcm[i], pcm16[i]))
                self._packets(row, final=utt.ending is not None)
                if utt.ending is not None:
                    self.end(row, utt.ending)
        if not g.ok:
            return None
        now, t = time.perf_counter(), flight.step.timing
        return StepStats(len(flight.rows), (now - flight.step.launched_at) * 1e3,
                         t["talker_ms"], t["code_predictor_ms"], t["decoder_ms"],
                         flight.prefills, (now - t0) * 1e3)

    def _packets(self, row: Row, final: bool) -> None:
        """Decoded frames out in packets of `EngineSettings.packet_size`."""
        s, utt = row
        while utt.pending and not utt.cancelled:
            size = self.settings.packet_size(utt.emitted)
            if len(utt.pending) < size and not final:
                break
            chunk, utt.pending = utt.pending[:size], utt.pending[size:]
            timings = None
            if utt.emitted == 0:
                first = utt.first_text or utt.created
                timings = dict(utt.timings,
                               first_packet_ms=(time.perf_counter() - first) * 1e3)
            last = final and not utt.pending
            chars = (utt.stream.chars if last and utt.ending == "eos" else
                     text_chars_read(row, utt.emitted + len(chunk)))
            packet = AudioPacket(utt.id, np.concatenate([pcm for _, pcm, _ in chunk]),
                                 utt.emitted, len(chunk), timings,
                                 np.stack([codes for codes, _, _ in chunk]),
                                 final=last, text_chars=chars,
                                 pcm16=b"".join(s16.tobytes() for *_, s16 in chunk))
            if s.emit(utt, packet):
                utt.emitted += len(chunk)
