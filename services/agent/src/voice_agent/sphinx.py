"""Offline speech recognition with PocketSphinx, for setups whose thinker takes no audio.

The PyPI wheel ships an English acoustic model, dictionary and trigram language model
(no download), so the local mesh and the compose `cpu` profile recognise real speech.
It is a small, old recogniser: on espeak-ng speech its word error rate is high (see the
agent README for the measured figure); a GPU thinker with an audio path is the real STT.

The decoder holds the GIL for its whole run (a 1.8 s utterance stalls a Python thread
~0.5 s), so it runs in worker processes (`python -m voice_agent.sphinx`), fed
while the user speaks. What is left at the end is the search's final pass over the
whole utterance (75-120 ms for 2 s of speech on an idle core, more on a busy host).
That pass is run early, speculatively: once the user has been quiet for part of the
VAD's silence hangover (`prepare()`), so the transcript is usually ready when the
hangover ends. If the user speaks again, `resume()` decodes the utterance anew from its
kept audio and nothing is lost. Each utterance leases one worker; a worker that dies
fails that utterance (the session speaks its fallback) and is replaced on the next one.

Wire protocol on the worker's stdin/stdout: requests are `<kind:1><len:u32le><payload>`,
kind A = 16 kHz s16le audio (starts an utterance if none), P = prepare (finish the
search now; audio after it is kept, not decoded), R = resume (decode everything kept,
go on), E = end (reply: the transcript, `<len:u32le><utf-8>`), C = cancel (no reply).
The worker announces itself with the reply "ready".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pocketsphinx import Decoder

log = logging.getLogger("voice_agent.stt.sphinx")

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


class SphinxError(RuntimeError):
    """A worker could not be started or died mid-utterance."""


class Utterance:
    """One utterance on a leased worker: feed audio as it comes, then `finish()`."""

    def __init__(self, worker: _Worker) -> None:
        self._w = worker

    def feed(self, pcm16k: bytes) -> None:
        if pcm16k:
            self._w.send(b"A", pcm16k)

    def prepare(self) -> None:
        """The speech seems to be over: run the final pass now, so `finish()` is quick."""
        self._w.send(b"P", b"")

    def resume(self) -> None:
        """The user spoke again after `prepare()`: go back to decoding."""
        self._w.send(b"R", b"")

    async def finish(self) -> str:
        self._w.send(b"E", b"")
        return await self._w.reply(END_TIMEOUT_S)

    def cancel(self) -> None:
        self._w.send(b"C", b"")


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voice_agent.sphinx",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
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

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()


class SphinxPool:
    """Up to `max_workers` recogniser processes, started on demand, reused across turns."""

    def __init__(self, max_workers: int = 2) -> None:
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
        w = await _Worker.start()
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


_POOLS: dict[tuple[int, int], SphinxPool] = {}


def shared_pool(max_workers: int) -> SphinxPool:
    """One pool per event loop (sessions of one process share the workers)."""
    key = (id(asyncio.get_running_loop()), max_workers)
    if key not in _POOLS:
        _POOLS[key] = SphinxPool(max_workers)
    return _POOLS[key]


class _Decoding:
    """The worker's one utterance: the decoder, the audio kept for a resume, and the
    transcript of a prepared (finished early) search."""

    def __init__(self, dec: Decoder) -> None:
        self.dec = dec
        self.audio: bytearray | None = None  # None: no utterance open
        self.prepared: str | None = None
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

    def end(self) -> str:
        if self.audio is None:
            return ""
        text = self.prepared if self.prepared is not None else self._end_search()
        self.audio, self.prepared, self.resumes = None, None, 0
        return text

    def _end_search(self) -> str:
        self.dec.end_utt()
        hyp = self.dec.hyp()
        return hyp.hypstr if hyp is not None else ""


def _serve() -> None:
    """The worker process: one decoder, utterances one after another."""
    from pocketsphinx import Decoder

    src, out = sys.stdin.buffer, sys.stdout.buffer

    def reply(text: str) -> None:
        data = text.encode()
        out.write(_LEN.pack(len(data)) + data)
        out.flush()

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
        elif kind == b"R":
            utt.resume()
        elif kind == b"E":
            reply(utt.end())
        elif kind == b"C":
            utt.end()


if __name__ == "__main__":
    _serve()
