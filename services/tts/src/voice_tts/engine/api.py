"""Public value types of the engine API (plain dataclasses, no tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .faults import FaultInjection
from .sampling import SamplingParams
from .voices.prompt import VoicePrompt


class EngineFull(RuntimeError):
    """All `max_sessions` slots are taken: reject the new session (never degrade others)."""


def packet_ramp(emitted: int, first: int, most: int) -> int:
    """Codec frames in an utterance's next packet, once `emitted` have been sent.

    The speech decoder makes one codec frame (80 ms, 1920 samples) per engine step; a
    packet only holds decoded frames back to hand over fewer, larger pieces. A held frame
    costs nothing while the client still has audio to play, so after the first packet
    each one holds at most half the audio already sent (at least 1 frame, at most
    `most`): 1, 1, 1, 1, 2, 3, 4, 4 ... for (1, 4). A player that starts at the first
    frame then never waits while a step takes up to 60 ms (packet k+1 is ready
    sent_{k+1} - 1 steps after the first, when sent_k x 80 ms has arrived; the worst is
    the packet of 3 after 6 frames sent: 8 steps for 480 ms);
    packets of 1 then straight 4 needed <= 20 ms (the second packet is made 4 steps after
    the first, which holds 80 ms): on a CPU every reply had a gap 80 ms in."""
    if emitted == 0:
        return first
    return max(1, min(most, emitted // 2))


@dataclass(frozen=True)
class EngineSettings:
    max_sessions: int = 32
    # Codec frames (80 ms each) in the first packet of an utterance, and the most in any
    # later one; between them the ramp of `packet_ramp` (1, 1, 1, 1, 2, 3, 4, 4 ...).
    first_packet_frames: int = 1
    packet_frames: int = 4
    # Talker KV-cache rows per session slot (prompt + frames of one utterance).
    max_seq_len: int = 2048
    # Max-length guard per utterance (length_guard.py): min(max_frames, base + frames per
    # character of its text: plain / East Asian wide / digit), ~2.5x what speech needs.
    max_frames: int = 2047
    max_frames_base: int = 24
    max_frames_per_char: float = 2.0
    max_frames_per_wide_char: float = 8.0
    max_frames_per_digit: float = 10.0
    # Sessions advanced by one batched talker step; batch_decode=False runs them one by one.
    max_batch: int = 32
    batch_decode: bool = True
    # CUDA only: capture the decode step as CUDA graphs (batch buckets 1, 2, 4 ... max_batch)
    # at start-up. False: eager (the reference the graphs are tested against).
    cuda_graphs: bool = True
    # The speech decoder's arithmetic: "fp32" (exact: streamed == whole decode at 111 dB),
    # "tf32" (TF32 convolutions and matmuls, ~61 dB), "bf16" (~36 dB, fastest: 256 vs 128
    # real-time streams on an H100) or "auto": bf16 on CUDA, fp32 on CPU.
    decoder_precision: str = "auto"
    # Prompts (prefills) run per loop iteration, before the batched step.
    max_prefills_per_step: int = 64
    # While a step has at most this many running rows, fresh prompts take their first
    # step in a launch of their own whose audio is out at once (pipelined engines): their
    # first frame then waits neither for the batch's talker and code predictor nor for
    # the next iteration's launch, for a few ms more on that iteration's period. 0: never.
    first_step_apart_max_rows: int = 32
    # CPU only: torch intra-op threads (process-wide!). Small models on a busy machine run
    # far faster with 1 (OpenMP barriers under oversubscription); None leaves torch's default.
    cpu_threads: int | None = None
    # Benchmarks: never sample codec EOS, so every stream runs to its frame cap (the peer's
    # bench sets min_new_tokens = max_new_tokens for the same).
    ignore_eos: bool = False
    # Tests: inject a fault into the n-th decode step, `<cuda|bug|hang>@<n>[:launch|tokens]`
    # (faults.FaultInjection; the server's TTS_TEST_FAULT). None in production.
    fault: str | None = None

    def packet_size(self, emitted: int) -> int:
        """Codec frames in the next packet of an utterance that has sent `emitted`."""
        return packet_ramp(emitted, self.first_packet_frames, self.packet_frames)

    def validate(self) -> None:
        if self.max_sessions < 1 or self.max_batch < 1:
            raise ValueError("max_sessions and max_batch must be >= 1")
        if self.first_packet_frames < 1 or self.packet_frames < 1:
            raise ValueError("first_packet_frames and packet_frames must be >= 1")
        if self.decoder_precision not in ("auto", "fp32", "tf32", "bf16"):
            raise ValueError("decoder_precision must be auto, fp32, tf32 or bf16")
        if self.max_frames < 1 or self.max_seq_len < 64:
            raise ValueError("max_frames must be >= 1 and max_seq_len >= 64")
        if self.first_step_apart_max_rows < 0:
            raise ValueError("first_step_apart_max_rows must be >= 0 (0: never)")
        if self.fault is not None:
            FaultInjection(self.fault)  # a bad spec fails here, with the accepted form


@dataclass(frozen=True)
class SessionParams:
    # A voice of the engine's table by name; with `voice_prompt`, only the session's label.
    voice: str
    language: str = "auto"
    instruct: str = ""  # 1.7B only; the 0.6B model ignores it (as the official code does)
    seed: int | None = None  # None: a random seed
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_text_chars: int = 4000  # per utterance
    # True: wait for the whole text (flush) and use the official non_streaming_mode prompt.
    non_streaming_mode: bool = False
    max_frames: int | None = None  # per-utterance cap (None: derived from the text length)
    # The session's own voice (inline reference audio): resolved from it, never added to
    # the table where other sessions could name it.
    voice_prompt: VoicePrompt | None = None

    def validate(self) -> None:
        """ValueError naming the first parameter out of range (sampling's included)."""
        self.sampling.validate()
        if self.max_text_chars < 1:
            raise ValueError("max_text_chars must be >= 1")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError("max_frames must be >= 1")


@dataclass
class AudioPacket:
    utterance_id: int
    pcm: np.ndarray  # float32 mono, 24 kHz, frames * 1920 samples
    first_frame: int
    frames: int
    timings: dict | None = None  # first packet: queue_ms, prefill_ms, first_packet_ms
    codes: np.ndarray | None = None  # (frames, 16) codec codes of this packet
    # The utterance's last packet, where known with it (the frame cap; EOS with frames
    # still held for a packet). EOS is sampled one step after the last frame: then the
    # last packet goes out unflagged and its UtteranceEnd alone closes the utterance.
    final: bool = False
    # Characters of the utterance's text (as pushed) the talker had read when it made the
    # packet's last frame (scheduler.text_chars_read); the last packet of an utterance
    # that ended by EOS: all of it. Offline (non_streaming_mode): all of it.
    text_chars: int = 0
    # `pcm` as s16le (`to_s16`), converted for a whole step's batch at once on the engine
    # thread; None where a packet was made without it (the server then converts).
    pcm16: bytes | None = None


def to_s16(pcm: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> little-endian int16, clipped and rounded (any shape). One call
    a step for the whole batch: per packet on the server's event loop, ~400 numpy calls at
    once each gave up the GIL to the engine thread and the loop stalled 40-90 ms
    (bench/results/2026-11-27-front-cost, `--stall-stacks`)."""
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype("<i2")


@dataclass
class UtteranceEnd:
    utterance_id: int
    frames: int
    # eos / max_frames: spoken to its end; cancelled: stopped by the client; invalid: its
    # input cannot be synthesized (INVALID_ARGUMENT); error: engine work failed.
    reason: Literal["eos", "max_frames", "cancelled", "invalid", "error"]
    error: str = ""  # what went wrong (invalid / error)
    # What its last audio had read (AudioPacket.text_chars): eos, all of the text;
    # max_frames, what its last frame had read; else 0.
    text_chars: int = 0


@dataclass
class StepStats:
    """One decode step. `step_ms`: wall time from its launch until its audio was handed to
    the sinks (with CUDA graphs its decoder runs beside the next step: in a steady stream
    this is the time per frame). Part times are GPU time (CUDA events) with CUDA graphs,
    else host wall-clock (on CUDA without graphs: launch time only)."""

    batch_size: int
    step_ms: float
    talker_ms: float
    code_predictor_ms: float
    decoder_ms: float
    prefills: int = 0
    emit_ms: float = 0.0  # host: packets built and handed to the sinks
