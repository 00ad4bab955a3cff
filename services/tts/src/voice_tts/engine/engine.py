"""The engine: sessions in, audio packets out, one background thread running the steps.

Each loop iteration is vLLM's three calls: `schedule()` (scheduler.py: who needs what,
plain data) -> `execute` (runner.py: prompts, then one batched step over every ready
session: code predictor, talker, speech decoder) -> `update` (here: stop checks from the
step's tokens; frames, packets and ends from its audio). On CUDA the audio of a step is
read one iteration later, after the next step is launched: its speech decoder runs
beside that step (`runner.Step`), so an utterance that ends is marked (`ending`) and
ends when its last audio is out.

What the engine waits for (see README): a streaming utterance starts (prefill) once its
first text token is *stable* (the first word is followed by another character, or
flush) and some non-whitespace text has arrived; afterwards each talker step needs the
next text token (or flush). Frames reach the client in packets of `first_packet_frames`,
then a ramp up to `packet_frames` (`api.packet_ramp`).

The engine knows nothing about gRPC, resampling or 20 ms framing: that is the server's.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .api import (
    AudioPacket,
    EngineFull,
    EngineSettings,
    SessionParams,
    StepStats,
    UtteranceEnd,
)
from .checkpoint import load_model, prepare, random_model
from .config import ModelConfig
from .faults import EngineFailed, poisons_device
from .length_guard import max_frames_for
from .model import Qwen3TTS
from .runner import PrefillRequest, Runner, Step
from .sampling import SamplingParams
from .scheduler import Need, Scheduler, SessionView
from .session import Session, Sink, Utterance
from .text import TextTokenizer, load_text_tokenizer
from .voices import UnknownVoice, Voice, VoiceTable

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: Qwen3TTS, tokenizer: TextTokenizer,
                 settings: EngineSettings | None = None, name: str | None = None) -> None:
        self.settings = settings or EngineSettings()
        self.settings.validate()
        self.model, self.cfg = model, model.cfg
        self.tokenizer = tokenizer
        precision = self.settings.decoder_precision
        if precision == "auto":
            precision = "bf16" if next(model.parameters()).is_cuda else "fp32"
        model.speech_decoder.set_precision(precision)
        self.runner = Runner(model, self.settings.max_sessions, self.settings.max_seq_len)
        self.device = self.runner.device
        if self.settings.cuda_graphs and self.device.type == "cuda":
            self.runner.enable_graphs(self.settings.max_batch,
                                       self.settings.max_prefills_per_step)
        if self.settings.cpu_threads and self.device.type == "cpu":
            torch.set_num_threads(self.settings.cpu_threads)
        self.scheduler = Scheduler(self.settings.max_batch, self.settings.max_prefills_per_step,
                                   self.settings.batch_decode)
        self.voice_table = VoiceTable(self.cfg.talker)
        self._name = name or self.cfg.name
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._free_slots = list(range(self.settings.max_sessions - 1, -1, -1))
        self._next_id = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The last launched step, until its audio is out: (rows, step, prompts run in the
        # iteration that launched it).
        self._in_flight: tuple[list[tuple[Session, Utterance]], Step, int] | None = None
        self.on_step = None  # callable(StepStats) | None
        self.faults = 0  # engine work that raised (each ended the utterances it touched)
        # A fault that poisons the device (faults.py): the engine has stopped for good.
        self.fatal: BaseException | None = None
        self.on_fatal = None  # callable(BaseException) | None, called once, engine thread
        self._beat = time.monotonic()  # the loop's last turn (see `stalled_for`)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu",
                        dtype: torch.dtype | None = None,
                        settings: EngineSettings | None = None) -> Engine:
        model = load_model(path, device=device, dtype=dtype)
        tok = TextTokenizer(load_text_tokenizer(path), model.cfg.im_start_token_id,
                            model.cfg.im_end_token_id)
        return cls(model, tok, settings, name=Path(path).name)

    @classmethod
    def from_preset(cls, name: str, seed: int = 0, settings: EngineSettings | None = None,
                    device: str = "cpu", dtype: torch.dtype | None = None) -> Engine:
        """Random weights at a named shape (tiny, tiny-1.7b, 0.6b, 1.7b): noise, for tests,
        CPU demos and GPU benchmarks. The text tokenizer is a small byte-level BPE."""
        from .demo_tokenizer import demo_tokenizer

        cfg = ModelConfig.from_name(name)
        model = prepare(random_model(cfg, seed), device, dtype)
        tok = TextTokenizer(demo_tokenizer(), cfg.im_start_token_id, cfg.im_end_token_id)
        return cls(model, tok, settings, name=f"preset:{name}")

    # --- introspection ----------------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return self.cfg.speech_decoder.sample_rate

    @property
    def frame_samples(self) -> int:
        return self.cfg.speech_decoder.frame_samples

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def bucket_step_ms(self) -> dict[int, float]:
        """One decode step's ms per CUDA-graph batch bucket, timed at warm-up ({} without
        graphs): where admission's capacity model starts."""
        graphs = self.runner.graphs
        return dict(graphs.step_ms) if graphs is not None else {}

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def voices(self) -> list[Voice]:
        return self.voice_table.voices()

    def languages(self) -> list[str]:
        return self.voice_table.languages()

    # --- sessions ---------------------------------------------------------------------------

    def open_session(self, params: SessionParams, sink: Sink) -> Session:
        voice = self.voice_table.resolve(params.voice, params.language)  # UnknownVoice
        params.sampling.validate()
        if params.max_text_chars < 1:
            raise ValueError("max_text_chars must be >= 1")
        if params.max_frames is not None and params.max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        if not callable(sink):
            raise ValueError("sink must be callable")
        instruct_ids = None
        if params.instruct and self.cfg.supports_instruct:
            instruct_ids = self.tokenizer.instruct_ids(params.instruct)
        if self.fatal is not None:
            raise EngineFailed(f"engine stopped after a fatal fault: {self.fatal}")
        with self._lock:
            if not self._free_slots:
                raise EngineFull(f"engine full: {self.settings.max_sessions} sessions active")
            slot = self._free_slots.pop()
            sid = self._next_id
            self._next_id += 1
            session = Session(self, sid, slot, params, voice, instruct_ids, sink, self.tokenizer)
            self._sessions[sid] = session
        return session

    def _release(self, session: Session) -> None:
        # Safe while a step of this slot may still be in flight: the engine thread is the
        # only writer of the caches, a new owner's prompt rewrites the rows it will read,
        # and stale rows past a query's position are masked.
        with self._lock:
            if self._sessions.pop(session.id, None) is not None:
                self._free_slots.append(session.slot)
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tts-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.close()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def stalled_for(self) -> float:
        """Seconds since the engine thread last turned its loop (it turns at least every
        50 ms when idle); 0 when it is not running. A stuck device sync shows here."""
        if self._thread is None or self._stop.is_set():
            return 0.0
        return time.monotonic() - self._beat

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._beat = time.monotonic()
            try:
                busy = self.run_once()
            except EngineFailed:
                return
            except Exception as exc:
                if poisons_device(exc):
                    self._fail(exc)
                    return
                self.faults += 1  # a bug outside any step's rows: keep serving the others
                log.exception("engine iteration failed")
                busy = False
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    def _fail(self, exc: BaseException) -> None:
        """A fatal fault: stop stepping for good and tell the owner (who must restart
        the process: the CUDA context is broken)."""
        if self.fatal is not None:
            return
        self.fatal = exc
        self._stop.set()
        log.critical("fatal engine fault, the engine has stopped: %s", exc)
        if self.on_fatal is not None:
            try:
                self.on_fatal(exc)
            except Exception:
                log.exception("on_fatal hook failed")

    def run_once(self) -> bool:
        """One engine iteration; returns False when there was nothing to do."""
        with self._step_lock, self.runner.on_stream():
            return self._iteration()

    def _iteration(self) -> bool:
        with self._lock:
            sessions = dict(self._sessions)
        busy = False
        for s in sessions.values():
            for utt in s.take_dropped():
                s.emit(utt, UtteranceEnd(utt.id, utt.emitted, "cancelled"), always=True)
                busy = True
        views, heads = [], {}
        for s in sessions.values():
            utt = s.head()
            if utt is None or utt.cancelled:
                continue
            heads[s.id] = utt
            views.append(SessionView(s.id, self._need(s, utt), utt.last_active or utt.created))
        plan = self.scheduler.schedule(views)
        if plan.idle and self._in_flight is None:
            return busy
        for sid in plan.end_empty:
            s, utt = sessions[sid], heads[sid]
            s.finish_head(utt)
            s.emit(utt, UtteranceEnd(utt.id, 0, "eos"))
        decode = list(plan.decode)
        if plan.prefill:
            self._guarded("prefill", [(sessions[sid], heads[sid]) for sid in plan.prefill],
                          self._prefill)
            # Fresh prompts take their first step now, not one iteration later (TTFA).
            room = self.settings.max_batch - len(decode)
            decode += [sid for sid in plan.prefill if heads[sid].running and
                       self._need(sessions[sid], heads[sid]) is Need.DECODE][:room]
        rows = [(sessions[sid], heads[sid]) for sid in decode]
        launched = self._guarded("launch", rows, self._launch) if rows else None
        delivered = [self._deliver()]  # the step before this one: its decoder is done
        if launched is not None and self._guarded("tokens", rows,
                                                  partial(self._advance, launched)):
            self._in_flight = rows, launched, len(plan.prefill)
            if not launched.pipelined:
                delivered.append(self._deliver())
        for stats in delivered:
            if stats is not None and self.on_step is not None:
                try:
                    self.on_step(stats)
                except Exception:
                    log.exception("on_step hook failed")
        return True

    def _need(self, s: Session, utt: Utterance) -> Need:
        if s.paused:  # its reader is behind: no new audio until it catches up
            return Need.NOTHING
        if utt.ending is not None:  # its last frame is still being decoded
            return Need.NOTHING
        committed, finished = utt.stream.snapshot()
        if not utt.running:
            if finished and not utt.stream.has_content:
                return Need.END_EMPTY
            if s.params.non_streaming_mode:
                return Need.PREFILL if finished else Need.NOTHING
            return Need.PREFILL if utt.stream.has_content and len(committed) > 3 else Need.NOTHING
        if s.params.non_streaming_mode or finished:
            return Need.DECODE
        return Need.DECODE if utt.steps + 1 < len(committed) - 3 else Need.NOTHING

    def _guarded(self, what: str, rows: list[tuple[Session, Utterance]], fn):
        """fn(rows); if it raises, end those utterances and keep serving the others."""
        try:
            return fn(rows)
        except Exception as exc:
            self.faults += 1
            if poisons_device(exc):
                self._fail(exc)
                raise EngineFailed(str(exc)) from exc
            log.exception("%s of sessions %s failed; ending their utterances", what,
                          [s.id for s, _ in rows])
            for s, utt in rows:
                self._end(s, utt, "error", f"{what} failed ({type(exc).__name__})")
            return None

    def _prefill(self, batch: list[tuple[Session, Utterance]]) -> None:
        reqs, fits = [], []
        for s, utt in batch:
            committed, _ = utt.stream.snapshot()
            text_ids = committed[3:]
            reqs.append((PrefillRequest(
                slot=s.slot, role_ids=committed[:3], codec_prefix=s.voice.codec_prefix,
                speaker_id=s.voice.speaker_id,
                text_ids=text_ids if s.params.non_streaming_mode else text_ids[:1],
                non_streaming=s.params.non_streaming_mode, instruct_ids=s.instruct_ids),
                s.params.sampling, s.next_seed()))
            # One session's prompt that cannot fit ends that session's utterance only.
            if (error := self.runner.prompt_error(reqs[-1][0])) is not None:
                reqs.pop()
                self._end(s, utt, "invalid", error)
            else:
                fits.append((s, utt))
        batch = fits
        if not batch:
            return
        t0 = time.perf_counter()
        lengths = self.runner.prefill(reqs)
        t1 = time.perf_counter()
        for (_, utt), length in zip(batch, lengths, strict=True):
            utt.running, utt.prompt_len, utt.last_active = True, length, t1
            first = utt.first_text or utt.created
            utt.timings = {"queue_ms": (t0 - first) * 1e3, "prefill_ms": (t1 - t0) * 1e3}

    def _text_id(self, s: Session, utt: Utterance) -> int:
        committed, _ = utt.stream.snapshot()
        n_text, idx = len(committed) - 3, utt.steps + 1
        if s.params.non_streaming_mode or idx > n_text:
            return self.cfg.tts_pad_token_id
        if idx == n_text:
            return self.cfg.tts_eos_token_id
        return committed[3 + idx]

    def _limit(self, s: Session, utt: Utterance) -> int:
        st = self.settings
        if s.params.max_frames is not None:
            limit = s.params.max_frames
        else:  # the text received so far: the talker never runs ahead of it
            limit = min(st.max_frames, max_frames_for(
                utt.stream.length, st.max_frames_base, st.max_frames_per_char,
                st.max_frames_per_wide_char, st.max_frames_per_digit))
        return min(limit, st.max_seq_len - utt.prompt_len - 1)

    def _launch(self, batch: list[tuple[Session, Utterance]]) -> Step:
        return self.runner.launch([s.slot for s, _ in batch],
                                  [self._text_id(s, utt) for s, utt in batch])

    def _advance(self, step: Step, batch: list[tuple[Session, Utterance]]) -> bool:
        """A step's tokens: count the frame, and mark utterances that end with it. True
        (`_guarded` gives None when reading them failed)."""
        tokens = step.tokens()
        eos = self.cfg.talker.codec_eos_token_id
        now = time.perf_counter()
        for (s, utt), token in zip(batch, tokens, strict=True):
            if utt.cancelled:
                continue
            utt.steps += 1
            utt.last_active = now
            if token == eos:
                utt.ending = "eos"
            elif utt.steps >= self._limit(s, utt):
                utt.ending = "max_frames"
        return True

    def _deliver(self) -> StepStats | None:
        """The step in flight's audio out as packets (and ends); its stats."""
        if self._in_flight is None:
            return None
        batch, step, prefills = self._in_flight
        self._in_flight = None

        def deliver(batch: list[tuple[Session, Utterance]]) -> float:
            codes, pcm = step.audio()
            t0 = time.perf_counter()
            for i, (s, utt) in enumerate(batch):
                if utt.cancelled or utt.ended:
                    continue
                utt.pending.append((codes[i], pcm[i]))
                self._emit_packets(s, utt, final=utt.ending is not None)
                if utt.ending is not None:
                    self._end(s, utt, utt.ending)
            return (time.perf_counter() - t0) * 1e3

        emit_ms = self._guarded("audio", batch, deliver)
        if emit_ms is None:
            return None
        t = step.timing
        return StepStats(len(batch), (time.perf_counter() - step.launched_at) * 1e3,
                         t["talker_ms"], t["code_predictor_ms"], t["decoder_ms"],
                         prefills, emit_ms)

    def _emit_packets(self, s: Session, utt: Utterance, final: bool) -> None:
        """Decoded frames out in packets: `first_packet_frames`, then the ramp up to
        `packet_frames` (`EngineSettings.packet_size`)."""
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
            packet = AudioPacket(utt.id, np.concatenate([pcm for _, pcm in chunk]),
                                 utt.emitted, len(chunk), timings,
                                 np.stack([codes for codes, _ in chunk]),
                                 final=final and not utt.pending)
            if s.emit(utt, packet):
                utt.emitted += len(chunk)

    def _end(self, s: Session, utt: Utterance, reason: str, error: str = "") -> None:
        if utt.ended:  # e.g. a failed step ended it while its last step was in flight
            return
        utt.ended = True
        s.finish_head(utt, truncated=reason == "max_frames")
        if not utt.cancelled:
            s.emit(utt, UtteranceEnd(utt.id, utt.emitted, reason, error))  # type: ignore[arg-type]

    # --- offline helper -----------------------------------------------------------------------

    def synthesize(self, text: str, voice: str, language: str = "auto", seed: int = 0,
                   sampling: SamplingParams | None = None, instruct: str = "",
                   non_streaming_mode: bool = False, max_frames: int | None = None,
                   return_codes: bool = False, max_text_chars: int = 4000,
                   timeout: float = 600.0):
        """Whole text in, whole utterance out (float32 PCM at 24 kHz), through the same
        session path. With `return_codes`, returns (pcm, codes (frames, 16))."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty")
        if len(text) > max_text_chars:
            raise ValueError(f"text over the limit of {max_text_chars} characters")
        packets: list[AudioPacket] = []
        done = threading.Event()
        end: list[UtteranceEnd] = []

        def sink(event) -> None:
            if isinstance(event, AudioPacket):
                packets.append(event)
            else:
                end.append(event)
                done.set()

        params = SessionParams(voice=voice, language=language, instruct=instruct, seed=seed,
                               sampling=sampling or SamplingParams(),
                               max_text_chars=max_text_chars,
                               non_streaming_mode=non_streaming_mode, max_frames=max_frames)
        session = self.open_session(params, sink)
        try:
            session.push_text(text)
            session.flush()
            threaded = self._thread is not None and self._thread.is_alive()
            deadline = time.monotonic() + timeout
            while not done.is_set():
                if self.fatal is not None:
                    raise EngineFailed(f"engine stopped after a fatal fault: {self.fatal}")
                if time.monotonic() > deadline:
                    raise TimeoutError("synthesis timed out")
                if threaded:
                    done.wait(0.05)
                else:
                    self.run_once()
        finally:
            session.close()
        pcm = (np.concatenate([p.pcm for p in packets]) if packets
               else np.zeros(0, dtype=np.float32))
        if not return_codes:
            return pcm
        codes = (np.concatenate([p.codes for p in packets]) if packets
                 else np.zeros((0, self.cfg.code_predictor.num_code_groups), dtype=np.int64))
        return pcm, codes


__all__ = ["Engine", "EngineFull", "UnknownVoice"]
