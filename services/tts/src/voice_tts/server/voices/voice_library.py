"""The voice library: cloned and designed voices, made once, kept on disk, used by name.

A voice is made from reference audio (Base checkpoints: `engine.make_voice_prompt`) or a
description (VoiceDesign: `engine.design_voice_prompt`) and stored as one file,
`<TTS_VOICE_DIR>/<name>.voice.npz`: its prompt (x-vector, reference codes, transcript,
description), the reference audio itself (mono s16 at its own rate: a voice can be made
again for another checkpoint) and its metadata (JSON). At start-up every stored voice
made for one of this server's model types and sizes is registered with the engine that
speaks it (`TTS_MODEL` may name several: `engine_set.py`); the others
are skipped with a log line.

Rules that keep the library safe:
- a name is `[A-Za-z0-9_-]{1,64}`, compared lower-case (as the engine compares voices):
  it names a file in the directory and nothing else; no path is ever built from
  anything else a client sends;
- a voice is written to a temporary file, fsynced, then renamed into place (and the
  directory fsynced): a crash or a full disk leaves the old state, never half a voice;
  temporary files left by a crash are removed at start-up;
- reference audio is refused with a message when it is not audio, shorter than 3 s or
  longer than 30 s, silent, or not finite; clipped audio (over 1% of samples at full
  scale) is kept, with a warning in the answer and the metadata (the clone copies the
  distortion: record again if it matters);
- a voice deleted while sessions speak with it: they keep the prompt they resolved;
  new sessions get "unknown voice".
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voice_tts.engine import Engine
from voice_tts.engine.engine_set import EngineSet
from voice_tts.engine.voices import VoicePrompt
from voice_tts.server.errors import VoiceError
from voice_tts.server.metrics import TTSMetrics
from voice_tts.server.voices.reference_audio import (
    AudioError,
    ReferenceAudio,
    check_audio,
    decode_audio,
)

log = logging.getLogger("voice_tts.voices")

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_REF_TEXT_CHARS = 1000
MAX_DESCRIPTION_CHARS = 1000
SUFFIX = ".voice.npz"
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = 1
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# Reference audio decoded at once (worker threads); more wait their turn.
DECODERS = 2
# A decode that takes longer is answered 400 at once (its thread finishes in the
# background and only then frees its decoder slot): the chunk cap and the upload limit
# bound the work, this bounds the wait whatever the host's load.
DECODE_TIMEOUT_S = 10.0


@dataclass
class StoredVoice:
    name: str
    kind: str  # "clone" | "design"
    created_at: int  # unix seconds
    model_type: str  # the engine's model type it was made for
    model_size: str  # tts_model_size ("0b6", "1b7")
    hidden_size: int  # the talker's: an x-vector fits only its own size
    duration_s: float = 0.0  # the reference audio's
    source_rate: int = 0
    ref_text: str = ""
    x_vector_only: bool = False
    description: str = ""
    consent: str = ""  # what the client sent as `consent` (kept, not checked)
    file_size: int = 0  # the upload's bytes
    warnings: list[str] = field(default_factory=list)
    prompt: VoicePrompt = field(default_factory=VoicePrompt, repr=False)
    audio: np.ndarray | None = field(default=None, repr=False)  # mono s16 at source_rate

    def info(self) -> dict[str, Any]:
        """The metadata (JSON), as stored and as the HTTP API shows it."""
        d = asdict(self)
        d.pop("prompt"), d.pop("audio")
        return d


def check_name(name: str) -> str:
    """The library's spelling of a name (lower-case), or VoiceError "invalid"."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        shown = repr(name[:64]) if isinstance(name, str) else type(name).__name__
        raise VoiceError("invalid", f"voice name {shown} is not allowed: use 1 to 64 "
                         "letters, digits, '_' or '-'")
    return name.lower()


# --- the store ---------------------------------------------------------------------------


def _to_npz(v: StoredVoice) -> bytes:
    arrays: dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps({"format": FORMAT_VERSION, **v.info()}).encode(),
                              np.uint8)}
    p = v.prompt
    if p.x_vector is not None:
        arrays["x_vector"] = np.asarray(p.x_vector, np.float32)
    if p.ref_codes is not None:
        arrays["ref_codes"] = np.asarray(p.ref_codes, np.int64)
    arrays["text"] = np.frombuffer(json.dumps({"ref_text": p.ref_text,
                                               "instruct": p.instruct}).encode(), np.uint8)
    if v.audio is not None:
        arrays["audio"] = v.audio
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _from_npz(path: Path) -> StoredVoice:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes())
        if meta.pop("format", None) != FORMAT_VERSION:
            raise ValueError("unknown file format version")
        text = json.loads(z["text"].tobytes())
        prompt = VoicePrompt(
            x_vector=z["x_vector"].astype(np.float32) if "x_vector" in z else None,
            ref_codes=z["ref_codes"].astype(np.int64) if "ref_codes" in z else None,
            ref_text=str(text.get("ref_text", "")), instruct=str(text.get("instruct", "")))
        audio = z["audio"].astype(np.int16) if "audio" in z else None
    known = set(StoredVoice.__dataclass_fields__) - {"prompt", "audio"}
    return StoredVoice(**{k: v for k, v in meta.items() if k in known}, prompt=prompt,
                       audio=audio)


class VoiceLibrary:
    """The library of one server. Reads and writes only `directory`'s `*.voice.npz` and
    its own temporary files. Creation and deletion are serialized (one at a time); the
    slow part (the prompt, the file) runs in a worker thread, the engine's voice table
    is changed on the event loop (where sessions open)."""

    def __init__(self, engine: Engine | EngineSet, directory: Path | None, max_upload_bytes: int,
                 metrics: TTSMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.dir = Path(directory).resolve() if directory is not None else None
        self.max_upload_bytes = max_upload_bytes
        self.voices: dict[str, StoredVoice] = {}
        self._lock = asyncio.Lock()
        self._decoders = asyncio.Semaphore(DECODERS)
        self._seen: dict[str, int] = {}  # file name -> mtime, as last read (or skipped)
        self._warned: set[str] = set()
        self._dir_mtime = -1
        self._watch: asyncio.Task[None] | None = None

    def _changed(self) -> None:
        if self.metrics is not None:
            self.metrics.library_voices.set(len(self.voices))

    def _kinds(self) -> str:
        return ", ".join(e.model_type for e in self.engine.members)

    def _maker(self, kind: str) -> Engine:
        """The engine that makes voices of `kind` ("clone", "design"), or VoiceError."""
        e = self.engine.maker_for(kind)
        if e is None:
            ask = ("cannot clone a voice: run a Base checkpoint (Qwen3-TTS-12Hz-*-Base) for "
                   "that" if kind == "clone" else "cannot design a voice from a description:"
                   " run a VoiceDesign checkpoint (Qwen3-TTS-12Hz-1.7B-VoiceDesign) for that")
            raise VoiceError("unsupported", f"this server's checkpoint ({self._kinds()}) {ask}"
                             " (TTS_MODEL takes several, comma-separated)")
        return e

    @staticmethod
    def _model_size(engine: Engine) -> tuple[str, int]:
        cfg = engine.cfg
        return str(getattr(cfg, "tts_model_size", "")), int(cfg.talker.hidden_size)

    # --- start-up ------------------------------------------------------------------------

    def load(self) -> int:
        """Registers every stored voice made for this model; returns how many."""
        if self.dir is None:
            return 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"TTS_VOICE_DIR {self.dir}: cannot make it ({e.strerror})") \
                from None
        for tmp in self.dir.glob(TMP_PREFIX + "*"):
            log.warning("voice library: removing %s, left by an interrupted write", tmp.name)
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._dir_mtime = self._stat_dir()
        for name, (path, mtime) in self._files().items():
            self._seen[name] = mtime
            v = self._read(name, path)
            if v is not None:
                self._register(name, v)
        if self.voices:
            self._changed()
        log.info("voice library %s: %d voice(s) loaded", self.dir, len(self.voices))
        return len(self.voices)

    def start_watching(self, period_s: float) -> None:
        """Follow the directory: voices another server sharing it (replicas on one
        volume) creates or deletes appear here / go within `period_s`."""
        if self.dir is not None and period_s > 0:
            self._watch = asyncio.get_running_loop().create_task(self._follow(period_s))

    async def _follow(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            mtime = await asyncio.to_thread(self._stat_dir)
            if mtime != self._dir_mtime:  # a file was added, replaced or removed
                self._dir_mtime = mtime
                try:
                    await self.sync()
                except Exception:
                    log.exception("voice library: following %s failed", self.dir)

    async def sync(self) -> None:
        """The engine's library voices made equal to the directory's files."""
        async with self._lock:
            files = await asyncio.to_thread(self._files)
            changed = {n: p for n, (p, m) in files.items() if self._seen.get(n) != m}
            read = await asyncio.to_thread(
                lambda: {n: self._read(n, p) for n, p in changed.items()})
            gone = set(self.voices) - set(files)
            for name in gone | {n for n, v in read.items() if v is None and n in self.voices}:
                self.engine.remove_voice(name)  # open sessions keep theirs
                del self.voices[name]
                log.info("voice library: %r is gone from the directory", name)
            for name, v in read.items():
                if v is not None and self._register(name, v):
                    log.info("voice library: %r appeared in the directory", name)
            self._seen = {n: m for n, (_, m) in files.items()}
            if gone or changed:
                self._changed()

    def _stat_dir(self) -> int:
        assert self.dir is not None
        try:
            return self.dir.stat().st_mtime_ns
        except OSError:
            return -1

    def _files(self) -> dict[str, tuple[Path, int]]:
        """The directory's voice files: name -> (path, mtime). Anything else is left
        alone (said once): a link could point out of the directory."""
        assert self.dir is not None
        out: dict[str, tuple[Path, int]] = {}
        for path in sorted(self.dir.glob("*" + SUFFIX)):
            name = path.name.removesuffix(SUFFIX)
            if (not NAME.fullmatch(name) or name != name.lower() or path.is_symlink()
                    or not path.is_file()):
                if path.name not in self._warned:
                    self._warned.add(path.name)
                    log.warning("voice library: skipping %s (not a library file: a plain "
                                "file named <name>.voice.npz)", path.name)
                continue
            with contextlib.suppress(OSError):
                out[name] = (path, path.stat().st_mtime_ns)
        return out

    def _read(self, name: str, path: Path) -> StoredVoice | None:
        """A voice file made for this model, or None (said why)."""
        try:
            v = _from_npz(path)
        except Exception as e:  # a damaged file must not stop the server
            log.error("voice library: skipping %s, unreadable (%s: %s)", path.name,
                      type(e).__name__, str(e)[:200])
            return None
        served = {(e.model_type, self._model_size(e)[1]) for e in self.engine.members}
        if (v.model_type, v.hidden_size) not in served:
            here = ", ".join(f"{self._model_size(e)[0]} {e.model_type}"
                             for e in self.engine.members)
            log.warning("voice library: skipping %r, made for a %s %s model (this server: "
                        "%s); create it again here", name, v.model_size, v.model_type, here)
            return None
        v.name = name
        return v

    def _register(self, name: str, v: StoredVoice) -> bool:
        try:
            self.engine.add_voice(name, v.prompt)
        except ValueError as e:
            log.warning("voice library: skipping %r: %s", name, e)
            return False
        self.voices[name] = v
        return True

    # --- requests ------------------------------------------------------------------------

    def get(self, name: str) -> StoredVoice | None:
        return self.voices.get(name.lower()) if isinstance(name, str) else None

    def list(self) -> list[StoredVoice]:
        return [self.voices[k] for k in sorted(self.voices)]

    async def _reference(self, ref: ReferenceAudio, ref_text: str
                         ) -> tuple[np.ndarray, int, list[str]]:
        """Reference audio checked for a clone: (mono float32, rate, warnings). The decode
        runs in a worker thread, at most `DECODERS` at once: on the event loop a big
        upload would stall every open stream for as long as it takes."""
        self._maker("clone")
        if len(ref.data) > self.max_upload_bytes:
            raise VoiceError("too_large", f"the audio is {len(ref.data)} bytes; the limit is "
                             f"{self.max_upload_bytes} (TTS_VOICE_MAX_UPLOAD_BYTES)")
        if len(ref_text) > MAX_REF_TEXT_CHARS:
            raise VoiceError("invalid", f"ref_text is {len(ref_text)} characters; the limit "
                             f"is {MAX_REF_TEXT_CHARS}")

        def decode() -> tuple[np.ndarray, int, list[str]]:
            try:
                audio, rate = decode_audio(ref)
                return audio, rate, check_audio(audio, rate)
            except AudioError as e:
                raise VoiceError("invalid", str(e)) from None

        await self._decoders.acquire()
        work = asyncio.ensure_future(asyncio.to_thread(decode))

        def done(t: asyncio.Future) -> None:
            self._decoders.release()
            if not t.cancelled():
                t.exception()  # retrieved: a late failure is no news after the timeout

        work.add_done_callback(done)
        try:
            return await asyncio.wait_for(asyncio.shield(work), DECODE_TIMEOUT_S)
        except TimeoutError:
            raise VoiceError("invalid", f"decoding the audio took over {DECODE_TIMEOUT_S:g}"
                             " s; send a plain WAV (fmt, then data) or raw PCM") from None

    async def inline_prompt(self, ref: ReferenceAudio, ref_text: str = "",
                            x_vector_only: bool = False) -> VoicePrompt:
        """A clone for one session (inline reference audio): made, not stored."""
        audio, rate, _ = await self._reference(ref, ref_text)
        ref_text = ref_text.strip()

        def make() -> VoicePrompt:
            try:
                return self.engine.make_voice_prompt(audio, rate, ref_text=ref_text,
                                                     x_vector_only=x_vector_only)
            except ValueError as e:
                raise VoiceError("invalid", f"cannot make a voice of it: {e}") from None

        return await asyncio.to_thread(make)

    async def create_from_audio(self, name: str, ref: ReferenceAudio, ref_text: str = "",
                                x_vector_only: bool = False, consent: str = "") -> StoredVoice:
        self._writable()
        key = check_name(name)
        audio, rate, warnings = await self._reference(ref, ref_text)
        ref_text = ref_text.strip()
        maker = self._maker("clone")
        size, hidden = self._model_size(maker)
        voice = StoredVoice(
            name=key, kind="clone", created_at=int(time.time()), model_type=maker.model_type,
            model_size=size, hidden_size=hidden, duration_s=round(len(audio) / rate, 3),
            source_rate=rate, ref_text=ref_text, x_vector_only=x_vector_only or not ref_text,
            consent=consent[:200], file_size=len(ref.data), warnings=warnings,
            audio=np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16))

        def make() -> VoicePrompt:
            return self.engine.make_voice_prompt(audio, rate, ref_text=ref_text,
                                                 x_vector_only=voice.x_vector_only)

        return await self._create(voice, make)

    async def create_from_description(self, name: str, description: str) -> StoredVoice:
        self._writable()
        maker = self._maker("design")
        description = description.strip()
        if not description or len(description) > MAX_DESCRIPTION_CHARS:
            raise VoiceError("invalid", f"the description must be 1 to {MAX_DESCRIPTION_CHARS}"
                             f" characters, got {len(description)}")
        key = check_name(name)
        size, hidden = self._model_size(maker)
        voice = StoredVoice(name=key, kind="design", created_at=int(time.time()),
                            model_type=maker.model_type, model_size=size, hidden_size=hidden,
                            description=description)
        return await self._create(voice,
                                  lambda: self.engine.design_voice_prompt(description))

    async def delete(self, name: str) -> StoredVoice:
        async with self._lock:
            key = name.lower() if isinstance(name, str) else ""
            voice = self.voices.get(key)
            if voice is None:
                if key in {v.name.lower() for v in self.engine.voices()}:
                    raise VoiceError("preset", f"{name[:64]!r} is a preset voice of the "
                                     "model; only library voices can be deleted")
                raise VoiceError("not_found", f"no library voice {name[:64]!r}")
            assert self.dir is not None
            self.engine.remove_voice(key)  # open sessions keep what they resolved
            try:
                await asyncio.to_thread(self._unlink, self.dir / (key + SUFFIX))
            except OSError as e:
                self.engine.add_voice(key, voice.prompt)  # still on disk: still a voice
                raise VoiceError("storage", f"could not delete the voice's file: "
                                 f"{e.strerror or e}") from None
            del self.voices[key]
            self._seen.pop(key, None)
            self._changed()
            log.info("voice library: deleted %r", key)
            return voice

    # --- internals -----------------------------------------------------------------------

    def _writable(self) -> None:
        if self.dir is None:
            raise VoiceError("unsupported", "this server has no voice library: set "
                             "TTS_VOICE_DIR to a directory (a volume in compose)")

    def _taken(self, key: str) -> None:
        if key in self.voices:
            raise VoiceError("exists", f"a voice named {key!r} exists; delete it first or "
                             "pick another name")
        if key in {v.name.lower() for v in self.engine.voices()}:
            raise VoiceError("exists", f"{key!r} is a preset voice of the model; pick "
                             "another name")
        assert self.dir is not None
        if (self.dir / (key + SUFFIX)).exists():  # skipped here: another model's, or damaged
            raise VoiceError("exists", f"the library holds a file for {key!r} that this "
                             "server cannot use (made for another model, or unreadable: "
                             "its log says which); pick another name")

    async def _create(self, voice: StoredVoice, make: Callable[[], VoicePrompt]
                      ) -> StoredVoice:
        async with self._lock:  # the name check and the write, one voice at a time
            self._taken(voice.name)

            def build() -> int:
                try:
                    voice.prompt = make()
                except ValueError as e:
                    raise VoiceError("invalid", f"cannot make a voice of it: {e}") from None
                data = _to_npz(voice)
                self._write(voice.name, data)
                return len(data)

            t0 = time.perf_counter()
            stored = await asyncio.to_thread(build)
            if self.metrics is not None:
                self.metrics.voice_create.labels(voice.kind).observe(time.perf_counter() - t0)
            with contextlib.suppress(OSError):  # our own file: not news when following
                self._seen[voice.name] = (self.dir / (voice.name + SUFFIX)).stat().st_mtime_ns
            try:
                self.engine.add_voice(voice.name, voice.prompt)
            except Exception as e:
                await asyncio.to_thread(self._unlink, self.dir / (voice.name + SUFFIX))
                if isinstance(e, ValueError):  # e.g. a reference too long for the slots
                    raise VoiceError("invalid", f"this server cannot use the voice: {e}") \
                        from None
                raise
            self.voices[voice.name] = voice
            self._changed()
            log.info("voice library: created %s voice %r (%d bytes stored)%s", voice.kind,
                     voice.name, stored, f"; {voice.warnings[0]}" if voice.warnings else "")
            return voice

    def _write(self, key: str, data: bytes) -> None:
        """Temp file, fsync, rename, fsync the directory: never half a voice. A full
        disk (or a file-size limit) -> VoiceError "storage", the temp file removed."""
        assert self.dir is not None
        tmp = self.dir / f"{TMP_PREFIX}{key}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / (key + SUFFIX))
            self._sync_dir()
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.error("voice library: cannot store %r: %s", key, e)
            if e.errno in FULL_DISK:
                raise VoiceError("storage", f"the voice library's disk is full ({e.strerror}); "
                                 "nothing was stored") from None
            raise VoiceError("io", f"the voice library cannot be written ({e.strerror}); "
                             "nothing was stored") from None

    def _unlink(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sync_dir()

    def _sync_dir(self) -> None:
        assert self.dir is not None
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
