"""The engine: sessions in, audio packets out, one background thread running the steps.

Each loop iteration is vLLM's `EngineCore.step`:

    out = scheduler.schedule()        # who prefills, who steps, who ends (plain data)
    prefill + launch                  # runner: prompts, then one batched decode step
    scheduler.update(rows, tokens)    # frames counted, ends decided (EOS, frame cap)
    output.deliver(...)               # packets and ends to the sinks (output.py)

On CUDA with graphs the audio of a step is read one iteration later, after the next step
is launched (its speech decoder runs beside that step): it waits as `output.InFlight`.
A new call's first step beside a small batch is launched apart and read at once
(`_first_steps`), so that its first frame leaves without that wait.
What the engine waits for (readiness, limits) is the scheduler's (scheduler.py); frames
reach the client in packets of `first_packet_frames`, then a ramp up to `packet_frames`.

The engine knows nothing about gRPC, resampling or 20 ms framing: that is the server's;
nor about the text track's layout (text.py) or packets (output.py).
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import compress
from pathlib import Path

import torch

from . import offline
from .api import EngineSettings, SessionParams, StepStats
from .checkpoint import load_model, prepare, random_model
from .config import ModelConfig
from .faults import EngineFailed, FaultInjection, poisons_device
from .model import Qwen3TTS
from .output import InFlight, Output
from .runner import Runner, Step
from .scheduler import Row, Scheduler
from .session import Session, Sink
from .text import TextTokenizer, load_text_tokenizer
from .voices import VoiceMaker, VoiceTable
from .voices.engine_voices import EngineVoices

log = logging.getLogger(__name__)


class Engine(EngineVoices):
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
        self.runner = Runner(model, self.settings.max_sessions, self.settings.max_seq_len,
                             ignore_eos=self.settings.ignore_eos)
        self.device = self.runner.device
        if self.settings.cuda_graphs and self.device.type == "cuda":
            self.runner.enable_graphs(self.settings.max_batch,
                                       self.settings.max_prefills_per_step)
        if self.settings.cpu_threads and self.device.type == "cpu":
            torch.set_num_threads(self.settings.cpu_threads)
        self.scheduler = Scheduler(self.settings, self.cfg)
        self.output = Output(self.settings, self._fail,
                             self.cfg.speech_decoder.codebook_size)
        self.voice_table = VoiceTable(self.cfg.talker, self.cfg.tts_model_type)
        self.voice_maker = VoiceMaker(model, tokenizer, self.runner.dtype,
                                      self.settings.max_seq_len)
        self._fault = FaultInjection(self.settings.fault) if self.settings.fault else None
        self._name = name or self.cfg.name
        self._step_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_flight: InFlight | None = None  # the last launched step, until its audio is out
        self.on_step = None  # callable(StepStats) | None
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
        return self.scheduler.active

    @property
    def faults(self) -> int:
        """Engine work that raised (each ended the utterances it touched)."""
        return self.output.faults

    @property
    def running(self) -> bool:
        """Its thread is stepping (else `run_once` steps it)."""
        return self._thread is not None and self._thread.is_alive()

    # --- sessions ---------------------------------------------------------------------------

    def open_session(self, params: SessionParams, sink: Sink) -> Session:
        if params.voice_prompt is None:
            voice = self.voice_table.resolve(params.voice, params.language)  # UnknownVoice
        else:
            voice = self.voice_table.resolve_prompt(
                self.voice_maker.library_voice(params.voice_prompt), params.language)
        params.validate()
        if not callable(sink):
            raise ValueError("sink must be callable")
        # A designed voice's description is its instruct (the session's replaces it); a
        # clone takes none (the official clone path has no instruct).
        instruct_ids = voice.instruct_ids
        if params.instruct and self.cfg.supports_instruct and voice.kind != "clone":
            instruct_ids = self.tokenizer.instruct_ids(params.instruct)
        if self.fatal is not None:
            raise EngineFailed(f"engine stopped after a fatal fault: {self.fatal}")
        return self.scheduler.add(lambda sid, slot: Session(
            sid, slot, params, voice, instruct_ids, sink, self.tokenizer,
            wake=self._wake.set, release=self._release))

    def _release(self, session: Session) -> None:
        self.scheduler.remove(session)
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tts-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for s in self.scheduler.open_sessions():
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
                self.output.faults += 1  # a bug outside any step's rows: serve the others
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
            return self._step()

    def _step(self) -> bool:
        out = self.scheduler.schedule()
        self.output.cancelled(out.cancelled)
        if out.idle and self._in_flight is None:
            return bool(out.cancelled)
        self.output.end_empty(out.end_empty)
        if out.prefill:
            with self.output.guard("prefill", out.prefill):
                self._prefill(out.prefill)
        rows, text_ids, talk = out.launchable()
        delivered: list[StepStats | None] = []
        if self._first_steps_apart(talk):
            delivered.append(self._first_steps(list(compress(rows, [not t for t in talk]))))
            rows, text_ids = list(compress(rows, talk)), list(compress(text_ids, talk))
            talk = [True] * len(rows)
        step = self._launch(rows, text_ids, talk) if rows else None
        delivered.append(self._deliver())  # the step before this one: its decoder is done
        if step is not None and self._read_tokens(step, rows):
            self._in_flight = InFlight(rows, step, len(out.prefill))
            if not step.pipelined:
                delivered.append(self._deliver())
        for stats in delivered:
            if stats is not None and self.on_step is not None:
                try:
                    self.on_step(stats)
                except Exception:
                    log.exception("on_step hook failed")
        return True

    def _first_steps_apart(self, talk: list[bool]) -> bool:
        """Fresh prompts (talk False) step apart from a small running batch
        (`EngineSettings.first_step_apart_max_rows`)."""
        running = sum(talk)
        return (self.runner.pipelined and 0 < running < len(talk)
                and running <= self.settings.first_step_apart_max_rows)

    def _first_steps(self, rows: list[Row]) -> StepStats | None:
        """Fresh prompts' first steps in a launch of their own (no talker: their prompts
        sampled frame 0), their audio out before the batch's step is launched. Returns the
        stats of the step that was in flight, read here (its audio must be out before the
        launch after the next). The apart step's own stats are not reported: its time
        counts in the period of the batch's step."""
        pad = self.cfg.tts_pad_token_id
        step = self._launch(rows, [pad] * len(rows), [False] * len(rows))
        stats = self._deliver()
        if step is not None and self._read_tokens(step, rows):
            self.output.deliver(InFlight(rows, step, 0))
        return stats

    def _launch(self, rows: list[Row], text_ids: list[int], talk: list[bool]) -> Step | None:
        """One batched step, launched, not waited for (None: it failed, its rows ended)."""
        with self.output.guard("launch", rows):
            if self._fault is not None:
                self._fault.on_launch()
            return self.runner.launch([s.slot for s, _ in rows], text_ids, talk)
        return None

    def _read_tokens(self, step: Step, rows: list[Row]) -> bool:
        """The step's codebook-0 tokens to the scheduler (frames counted, ends marked);
        False: reading them failed and ended its rows."""
        with self.output.guard("tokens", rows) as read:
            if self._fault is not None:
                self._fault.on_tokens()
            tokens = step.tokens()
            if self._fault is not None:
                tokens = self._fault.tokens(tokens, self.cfg.talker.codec_eos_token_id)
            self.scheduler.update(rows, tokens)
        return read.ok

    def _prefill(self, rows: list[Row]) -> None:
        reqs, fits = [], []
        for row in rows:
            req = self.scheduler.prompt(row)
            # One session's prompt that cannot fit ends that session's utterance only.
            if (error := self.runner.prompt_error(req[0])) is not None:
                self.output.end(row, "invalid", error)
            else:
                reqs.append(req)
                fits.append(row)
        if fits:
            t0 = time.perf_counter()
            lengths = self.runner.prefill(reqs)
            self.scheduler.started(fits, lengths, t0, time.perf_counter())

    def _deliver(self) -> StepStats | None:
        flight, self._in_flight = self._in_flight, None
        return self.output.deliver(flight) if flight is not None else None

    def synthesize(self, text: str, voice: str, *args, **kw):
        """Whole text in, whole utterance out: `offline.synthesize` (same arguments)."""
        return offline.synthesize(self, text, voice, *args, **kw)

