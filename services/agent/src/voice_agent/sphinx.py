"""Offline speech recognition, for setups whose thinker takes no audio: the offline ear.

Two models, each shipped inside its PyPI wheel (no download), so the local mesh and the
compose `cpu` profile recognise real speech (`AGENT_STT_OFFLINE_MODEL`):
- `moonshine` (default): Moonshine tiny-en, the model files of `moonshine-voice==0.1.0`
  (later versions dropped the weights from the wheel) run on our own ONNX Runtime
  sessions with `threads` threads (moonshine.py; the wheel's library takes a thread per
  core and more). One pass over the utterance at its end (or early, below). On espeak-ng
  speech (`bench/ear.py`): WER 0.15, PocketSphinx's 0.59.
- `pocketsphinx`: a small, old streaming decoder (English acoustic model, dictionary,
  trigram language model), fed while the user speaks.
A GPU thinker with an audio path is the real STT.

A decoder holds the GIL for its whole run (a 1.8 s utterance stalls a Python thread
~0.5 s), so it runs in worker processes (`python -m voice_agent.sphinx MODEL`), fed
while the user speaks. What is left at the end is PocketSphinx's final pass over the
whole utterance (75-120 ms for 2 s of speech on an idle core, more on a busy host), or
Moonshine's one pass (~60 ms a second of speech).
That pass is run early, speculatively: once the user has been quiet for part of the
VAD's silence hangover (`prepare()`), so the transcript is usually ready when the
hangover ends. If the user speaks again, `resume()` decodes the utterance anew from its
kept audio and nothing is lost. Each utterance leases one worker; a worker that dies
fails that utterance (the session speaks its fallback) and is replaced on the next one.
`python -m voice_agent.sphinx moonshine THREADS` runs Moonshine on THREADS intra-op
threads (the pool passes `AGENT_STT_THREADS`, default 1).

Wire protocol on the worker's stdin/stdout: requests are `<kind:1><len:u32le><payload>`,
kind A = 16 kHz s16le audio (starts an utterance if none), P = prepare (finish the
search now; audio after it is kept, not decoded; reply: the prepared transcript, "" if
the pass was not run early), R = resume (decode everything kept, go on), E = end (reply:
the transcript, `<len:u32le><utf-8>`), C = cancel (no reply). A transcript is its text,
and for Moonshine `\0<p_end> <p_last>` after it: how sure the decoder was of its end
(`Heard`). The prepared transcript is the session's preflight: its reply starts on it,
before the VAD's hangover ends. The worker announces itself with the reply "ready".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pocketsphinx import Decoder

log = logging.getLogger("voice_agent.stt.sphinx")

# The worker does no BLAS work: without these numpy's OpenBLAS starts a thread per core.
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_HDR = struct.Struct("<cI")
_LEN = struct.Struct("<I")
START_TIMEOUT_S = 30.0
END_TIMEOUT_S = 10.0
# A resume decodes the kept utterance again (~0.15 s of CPU a second of audio), which the
# worker must catch up on while the user speaks: no early pass past this much audio, nor
# after this many resumes (a long turn with many pauses keeps the pass at the end).
EARLY_PASS_MAX_S = 6.0
_BYTES_PER_S = 32000  # 16 kHz s16le
EARLY_PASS_MAX_RESUMES = 2


MODELS = ("moonshine", "pocketsphinx")


def stt_threads() -> int:
    """`AGENT_STT_THREADS` (settings.py, checked when the agent starts), else its default."""
    from .settings import AgentSettings

    env = os.environ.get("AGENT_STT_THREADS", "").strip()
    return int(env) if env else AgentSettings.model_fields["stt_threads"].default


class SphinxError(RuntimeError):
    """A worker could not be started or died mid-utterance."""


@dataclass(frozen=True)
class Heard:
    """An utterance's words, and how sure the ear was of where they end (Moonshine's
    decoder: `p_end`, the end token's probability where it ended; `p_last`, the last
    word's; None: an ear that says neither)."""
    text: str
    p_end: float | None = None
    p_last: float | None = None

    def sure(self, min_end: float, min_last: float) -> bool:
        """Whether the ear is sure enough of the end of its words to end a turn on."""
        return ((self.p_end is None or self.p_end >= min_end)
                and (self.p_last is None or self.p_last >= min_last))

    def wire(self) -> str:
        if self.p_end is None or self.p_last is None:
            return self.text
        return f"{self.text}\0{self.p_end:.4f} {self.p_last:.4f}"

    @classmethod
    def parse(cls, reply: str) -> Heard:
        text, _, sure = reply.partition("\0")
        try:
            p_end, p_last = (float(x) for x in sure.split())
        except ValueError:  # no probabilities (PocketSphinx)
            return cls(text)
        return cls(text, p_end, p_last)


class Utterance:
    """One utterance on a leased worker: feed audio as it comes, then `finish()`."""

    def __init__(self, worker: _Worker) -> None:
        self._w = worker
        self._ended = False

    def feed(self, pcm16k: bytes) -> None:
        if pcm16k:
            self._w.send(b"A", pcm16k)

    def prepare(self) -> None:
        """The speech seems to be over: run the final pass now, so `finish()` is quick
        (its transcript: `preflight()`)."""
        self._w.send(b"P", b"")
        self._w.unread += 1

    async def preflight(self) -> Heard | None:
        """The transcript of the pass `prepare()` ran ("" if it ran none); None once the
        utterance has ended. Shielded: a cancelled caller must not cut a reply in half."""
        async def read() -> str | None:
            async with self._w.lock:
                return None if self._ended else await self._w.drain()

        reply = await asyncio.shield(read())
        return None if reply is None else Heard.parse(reply)

    def resume(self) -> None:
        """The user spoke again after `prepare()`: go back to decoding."""
        self._w.send(b"R", b"")

    async def finish(self) -> Heard:
        self._ended = True
        self._w.send(b"E", b"")
        async with self._w.lock:
            await self._w.drain()  # the prepare replies come first
            return Heard.parse(await self._w.reply(END_TIMEOUT_S))

    def cancel(self) -> None:
        self._w.send(b"C", b"")


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.unread = 0  # replies to prepare requests not read yet
        self.lock = asyncio.Lock()  # one reader of its replies at a time

    @classmethod
    async def start(cls, model: str, threads: int = 1) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voice_agent.sphinx", model, str(threads),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **_ONE_THREAD})
        w = cls(proc)
        try:
            ready = await w.reply(START_TIMEOUT_S)
        except SphinxError:
            w.kill()
            raise
        if ready != "ready":
            w.kill()
            raise SphinxError(f"sphinx worker said {ready!r}, not ready")
        return w

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def send(self, kind: bytes, payload: bytes) -> None:
        assert self.proc.stdin is not None
        if not self.alive or self.proc.stdin.is_closing():
            raise SphinxError("sphinx worker is gone")
        self.proc.stdin.write(_HDR.pack(kind, len(payload)) + payload)

    async def reply(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                (n,) = _LEN.unpack(await self.proc.stdout.readexactly(_LEN.size))
                return (await self.proc.stdout.readexactly(n)).decode()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
            self.kill()
            raise SphinxError(f"sphinx worker failed ({type(e).__name__}); "
                              f"exit code {self.proc.returncode}") from None

    async def drain(self) -> str | None:
        """Reads the replies to the prepare requests sent so far (hold `lock`); the last
        one's transcript, None if there were none."""
        text = None
        while self.unread:
            text = await self.reply(END_TIMEOUT_S)
            self.unread -= 1
        return text

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()


class SphinxPool:
    """Up to `max_workers` recogniser processes, started on demand, reused across turns.
    `threads`: each Moonshine worker's ONNX Runtime threads; None = `AGENT_STT_THREADS`."""

    def __init__(self, max_workers: int = 2, model: str = "pocketsphinx",
                 threads: int | None = None) -> None:
        if model not in MODELS:
            raise ValueError(f"offline recogniser must be one of {MODELS}, not {model!r}")
        self.model = model
        self.threads = threads if threads is not None else stt_threads()
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(max_workers)
        self._all: set[_Worker] = set()

    async def prewarm(self) -> None:
        """Start one worker now, so the first utterance does not pay the start-up."""
        if not self._idle:
            async with self._slots:
                self._keep(await self._spawn())

    @contextlib.asynccontextmanager
    async def utterance(self) -> AsyncIterator[Utterance]:
        async with self._slots:
            w = self._idle.pop() if self._idle else await self._spawn()
            async with w.lock:  # a cancelled utterance's prepare replies
                await w.drain()
            utt = Utterance(w)
            try:
                yield utt
            except BaseException:
                with contextlib.suppress(SphinxError):
                    utt.cancel()
                raise
            finally:
                self._keep(w)

    async def _spawn(self) -> _Worker:
        w = await _Worker.start(self.model, self.threads)
        self._all.add(w)
        return w

    def _keep(self, w: _Worker) -> None:
        if w.alive:
            self._idle.append(w)
        else:
            self._all.discard(w)

    async def aclose(self) -> None:
        for w in list(self._all):
            if w.alive and w.proc.stdin is not None:
                w.proc.stdin.close()  # EOF: the worker exits on its own
        for w in list(self._all):
            try:
                await asyncio.wait_for(w.proc.wait(), 2.0)
            except TimeoutError:
                w.kill()
        self._all.clear()
        self._idle.clear()


_POOLS: dict[tuple[int, int, str], SphinxPool] = {}


def shared_pool(max_workers: int, model: str = "moonshine") -> SphinxPool:
    """One pool per event loop and model (sessions of one process share the workers)."""
    key = (id(asyncio.get_running_loop()), max_workers, model)
    if key not in _POOLS:
        _POOLS[key] = SphinxPool(max_workers, model)
    return _POOLS[key]


class _Decoding:
    """The worker's one utterance: the decoder, the audio kept for a resume, and the
    transcript of a prepared (finished early) search."""

    def __init__(self, dec: Decoder) -> None:
        self.dec = dec
        self.audio: bytearray | None = None  # None: no utterance open
        self.prepared: Heard | None = None
        self.resumes = 0

    def feed(self, pcm: bytes) -> None:
        if self.audio is None:
            self.audio = bytearray()
            self.dec.start_utt()
        self.audio += pcm
        if self.prepared is None:
            self.dec.process_raw(pcm, no_search=False, full_utt=False)

    def prepare(self) -> None:
        if (self.audio is not None and self.prepared is None
                and len(self.audio) <= EARLY_PASS_MAX_S * _BYTES_PER_S
                and self.resumes < EARLY_PASS_MAX_RESUMES):
            self.prepared = self._end_search()

    def resume(self) -> None:
        if self.audio is not None and self.prepared is not None:
            self.prepared = None
            self.resumes += 1
            self.dec.start_utt()
            self.dec.process_raw(bytes(self.audio), no_search=False, full_utt=False)

    def end(self) -> Heard:
        if self.audio is None:
            return Heard("")
        heard = self.prepared if self.prepared is not None else self._end_search()
        self.audio, self.prepared, self.resumes = None, None, 0
        return heard

    def _end_search(self) -> Heard:
        self.dec.end_utt()
        hyp = self.dec.hyp()
        return Heard(hyp.hypstr if hyp is not None else "")


class _WholeDecoding:
    """The worker's one utterance for a model that hears it whole (Moonshine): the audio,
    and the transcript of a pass run early (`prepare`) on what had come by then. Audio
    after it (the hangover's silence) is kept, not heard; `resume` forgets the pass."""

    def __init__(self, transcribe: Callable[[bytes], Heard]) -> None:
        self.transcribe = transcribe
        self.audio: bytearray | None = None
        self.prepared: Heard | None = None

    def feed(self, pcm: bytes) -> None:
        if self.audio is None:
            self.audio = bytearray()
        self.audio += pcm

    def prepare(self) -> None:
        if self.audio is not None and self.prepared is None:
            self.prepared = self.transcribe(bytes(self.audio))

    def resume(self) -> None:
        self.prepared = None

    def end(self) -> Heard:
        if self.audio is None:
            return Heard("")
        heard = self.prepared if self.prepared is not None else \
            self.transcribe(bytes(self.audio))
        self.audio, self.prepared = None, None
        return heard


def _trim_silence(pcm: np.ndarray, floor: int = 64, keep: int = 1600) -> np.ndarray:
    """The utterance without its near-silent head and tail (10 ms blocks under `floor`,
    about -54 dBFS), less `keep` samples each side: Moonshine writes "You" for half a
    second of digital silence before speech (bench/ear.py's padding check)."""
    n = len(pcm) // 160
    if n == 0:
        return pcm
    loud = np.flatnonzero(np.abs(pcm[:n * 160].reshape(n, 160)).max(axis=1) >= floor)
    if len(loud) == 0:
        return pcm[:0]
    return pcm[max(0, loud[0] * 160 - keep):min(len(pcm), (loud[-1] + 1) * 160 + keep)]


def _moonshine(threads: int = 1) -> Callable[[bytes], Heard]:
    """Moonshine tiny-en (moonshine.py) on `threads` threads: 16 kHz s16le -> words."""
    from .moonshine import VAD_HOP, Moonshine

    model = Moonshine(threads)

    def transcribe(pcm: bytes) -> Heard:
        audio = _trim_silence(np.frombuffer(pcm, np.int16)).astype(np.float32) / 32768.0
        if len(audio) < 1600:  # under 0.1 s: nothing to hear
            return Heard("")
        # as the library heard it: whole hops of its VAD (the tail is the trim's quiet)
        text, p_end, p_last = model.hear(audio[:len(audio) // VAD_HOP * VAD_HOP])
        return Heard(text.strip(), p_end, p_last)

    return transcribe


def _serve(model: str, threads: int = 1) -> None:
    """The worker process: one decoder, utterances one after another."""
    src, out = sys.stdin.buffer, sys.stdout.buffer

    def reply(text: str) -> None:
        data = text.encode()
        out.write(_LEN.pack(len(data)) + data)
        out.flush()

    if model == "moonshine":
        utt: _Decoding | _WholeDecoding = _WholeDecoding(_moonshine(threads))
    else:
        from pocketsphinx import Decoder

        utt = _Decoding(Decoder(samprate=16000, loglevel="FATAL"))
    reply("ready")
    while True:
        hdr = src.read(_HDR.size)
        if len(hdr) < _HDR.size:
            return  # stdin closed: the agent is done with us
        kind, n = _HDR.unpack(hdr)
        payload = src.read(n) if n else b""
        if kind == b"A":
            utt.feed(payload)
        elif kind == b"P":
            utt.prepare()
            reply(utt.prepared.wire() if utt.prepared is not None else "")
        elif kind == b"R":
            utt.resume()
        elif kind == b"E":
            reply(utt.end().wire())
        elif kind == b"C":
            utt.end()


if __name__ == "__main__":
    _serve(sys.argv[1] if len(sys.argv) > 1 else "pocketsphinx",
           int(sys.argv[2]) if len(sys.argv) > 2 else 1)
