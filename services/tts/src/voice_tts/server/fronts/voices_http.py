"""The voice library over HTTP, shaped as vLLM-Omni's and OpenAI's voice APIs:

- `POST /v1/audio/voices` (multipart/form-data; a designed voice's text-only fields may
  come urlencoded or as JSON, as OpenAI's prompt-based create sends them): `name`, and
  either `audio_sample` (a file: WAV, or raw PCM with `format` pcm_s16le / pcm_f32le,
  `sample_rate`, `channels`) with optional `ref_text` and `x_vector_only`, or
  `description` (VoiceDesign checkpoints; OpenAI's `prompt` and `instructions` are its
  aliases). `consent` is accepted and kept. -> 200: OpenAI's Voice (`id`, `object`
  "audio.voice", `name`, `created_at`, `type` audio_sample / prompt) with vLLM-Omni's
  `{"success": true, "voice": {...}}` beside it.
- `GET /v1/audio/voices`: every voice (`voices`: name, languages, dialect, kind), the
  languages, and the library's voices in full (`uploaded_voices`, as vLLM-Omni names them).
- `GET /v1/audio/voices/{name}`, `DELETE /v1/audio/voices/{name}` (-> OpenAI's `{"id",
  "object": "audio.voice.deleted", "deleted": true}` with vLLM-Omni's `success`, `message`).

Errors are OpenAI's body with the status `errors.STATUS` gives: 400 bad audio or
name, 404 unknown voice, 409 name taken, 413 upload too large, 415 not multipart, 501
this checkpoint cannot make that voice (or no TTS_VOICE_DIR), 507 the disk is full.
"""

from __future__ import annotations

from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import BadHttpMessage

from voice_tts.engine import UnknownVoice, Voice
from voice_tts.server.errors import VoiceError
from voice_tts.server.fronts.json_schema import load_json
from voice_tts.server.fronts.openai_speech import ApiError
from voice_tts.server.voices.reference_audio import ReferenceAudio
from voice_tts.server.voices.voice_library import StoredVoice, VoiceLibrary

MAX_FIELD_BYTES = 8 * 1024  # a form field other than the audio (name, ref_text, ...)
# vLLM-Omni's and OpenAI's form fields (`type`, `model`, `script_hint`, `language`,
# `speaker_description` are taken and not used), then ours.
FIELDS = ("name", "ref_text", "consent", "type", "prompt", "model", "script_hint", "language",
          "speaker_description", "x_vector_only", "format", "sample_rate", "channels",
          "description", "instructions")
DESCRIPTION = ("description", "prompt", "instructions")  # a designed voice's, by any name


def _error(e: VoiceError) -> web.Response:
    return ApiError(e.status.http, e.message, code=e.kind, kind=e.status.openai).response()


class VoicesAPI:
    def __init__(self, library: VoiceLibrary) -> None:
        self.library = library
        self.engine = library.engine

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/audio/voices", self.list)
        app.router.add_post("/v1/audio/voices", self.create)
        app.router.add_get("/v1/audio/voices/{name}", self.get)
        app.router.add_delete("/v1/audio/voices/{name}", self.delete)

    def _voice(self, v: Voice) -> dict[str, Any]:
        out: dict[str, Any] = {"name": v.name, "languages": list(v.languages),
                               "dialect": v.dialect or None,
                               "kind": getattr(v, "kind", "preset")}
        stored = self.library.get(v.name)
        if stored is not None:
            out.update(self._stored(stored))
        return out

    def _stored(self, s: StoredVoice) -> dict[str, Any]:
        return {"id": s.name, "object": "audio.voice", **s.info(),
                "languages": self.engine.languages()}

    async def list(self, _: web.Request) -> web.Response:
        return web.json_response({
            "voices": [self._voice(v) for v in self.engine.voices()],
            "languages": list(self.engine.languages()),
            "uploaded_voices": [self._stored(s) for s in self.library.list()],
        })

    async def get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"].strip().lower()
        try:
            return web.json_response(self._voice(self.engine.voice_table.voice(name)))
        except UnknownVoice:
            return _error(VoiceError("not_found", f"unknown voice {name[:64]!r}; GET "
                                     "/v1/audio/voices lists them"))

    async def delete(self, request: web.Request) -> web.Response:
        try:
            v = await self.library.delete(request.match_info["name"])
        except VoiceError as e:
            return _error(e)
        return web.json_response({"id": v.name, "object": "audio.voice.deleted",
                                  "deleted": True, "success": True,
                                  "message": f"voice {v.name!r} deleted"})

    async def create(self, request: web.Request) -> web.Response:
        try:
            form, audio = await self._form(request)
            if audio is not None:
                ref = ReferenceAudio(audio, form.get("format", "wav").strip().lower(),
                                     _int(form, "sample_rate", 0), _int(form, "channels", 1))
                v = await self.library.create_from_audio(
                    form.get("name", ""), ref, form.get("ref_text", ""),
                    _bool(form, "x_vector_only"), form.get("consent", ""))
            elif description := next((form[k] for k in DESCRIPTION if k in form), None):
                v = await self.library.create_from_description(form.get("name", ""),
                                                               description)
            else:
                raise VoiceError("invalid", "send the reference audio as `audio_sample` (a "
                                 "file), or a `description` (VoiceDesign checkpoints)")
        except VoiceError as e:
            return _error(e)
        except ApiError as e:
            return e.response()
        # OpenAI's Voice object (the `openai` SDK reads it) and vLLM-Omni's answer, in one.
        return web.json_response({
            "id": v.name, "object": "audio.voice", "name": v.name, "created_at": v.created_at,
            "type": "prompt" if v.kind == "design" else "audio_sample",
            **({"prompt": v.description} if v.kind == "design" else {}),
            "success": True, "voice": self._stored(v)})

    async def _form(self, request: web.Request) -> tuple[dict[str, str], bytes | None]:
        """The form's text fields and the audio file, each read within its limit."""
        if request.content_type == "application/x-www-form-urlencoded":  # text only
            try:
                post = await request.post()
            except web.HTTPRequestEntityTooLarge:
                raise VoiceError("invalid", "a urlencoded form holds text fields only; "
                                 "send audio as multipart/form-data") from None
            form = {k: v for k, v in post.items() if isinstance(v, str)}
            if unknown := set(form) - set(FIELDS):
                raise VoiceError("invalid", f"unknown form field {sorted(unknown)[0][:32]!r}"
                                 f"; known: audio_sample, {', '.join(FIELDS)}")
            return form, None
        if request.content_type == "application/json":  # OpenAI's prompt-based create
            try:
                obj = load_json(await request.read())
            except (ValueError, web.HTTPRequestEntityTooLarge):
                raise VoiceError("invalid", "the body is not a JSON object within 1 MiB; send "
                                 "audio as multipart/form-data") from None
            if not isinstance(obj, dict) or not all(isinstance(v, str | bool | int)
                                                    for v in obj.values()):
                raise VoiceError("invalid", "the body must be a JSON object of text fields")
            form = {k: str(v).lower() if isinstance(v, bool) else str(v)
                    for k, v in obj.items()}
            if unknown := set(form) - set(FIELDS):
                raise VoiceError("invalid", f"unknown field {sorted(unknown)[0][:32]!r}; "
                                 f"known: {', '.join(FIELDS)}")
            return form, None
        if request.content_type != "multipart/form-data":
            raise ApiError(415, "send the voice as multipart/form-data (curl -F), not "
                           f"{request.content_type[:60]!r}", code="unsupported_media_type")
        limit = self.library.max_upload_bytes
        if request.content_length is not None and request.content_length > limit + (1 << 20):
            raise VoiceError("too_large", f"the request is {request.content_length} bytes; "
                             f"the audio limit is {limit} (TTS_VOICE_MAX_UPLOAD_BYTES)")
        form: dict[str, str] = {}
        audio: bytes | None = None
        try:
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    raise VoiceError("invalid", "nested multipart is not supported")
                if part.name == "audio_sample":
                    audio = await _read(part, limit, "too_large",
                                        f"the audio is over {limit} bytes "
                                        "(TTS_VOICE_MAX_UPLOAD_BYTES)")
                elif part.name in FIELDS:
                    raw = await _read(part, MAX_FIELD_BYTES, "invalid",
                                      f"form field {part.name!r} is over {MAX_FIELD_BYTES} "
                                      "bytes")
                    try:
                        form[part.name] = raw.decode()
                    except UnicodeDecodeError:
                        raise VoiceError("invalid", f"form field {part.name!r} is not "
                                         "UTF-8 text") from None
                else:
                    raise VoiceError("invalid", f"unknown form field {str(part.name)[:32]!r}; "
                                     f"known: audio_sample, {', '.join(FIELDS)}")
        except (ValueError, AssertionError) as e:  # aiohttp: a malformed multipart body
            raise VoiceError("invalid", f"malformed multipart body ({e})") from None
        except BadHttpMessage as e:  # aiohttp: a part's header lines are not headers
            raise VoiceError("invalid", "malformed multipart body: a part's headers must be "
                             "`Name: value` lines, then a blank line "
                             f"({str(e.message)[:80]})") from None
        return form, audio


async def _read(part: BodyPartReader, limit: int, kind: str, message: str) -> bytes:
    buf = bytearray()
    while chunk := await part.read_chunk(64 * 1024):
        buf.extend(chunk)
        if len(buf) > limit:
            raise VoiceError(kind, message)
    return bytes(buf)


def _int(form: dict[str, str], key: str, default: int) -> int:
    try:
        return int(form.get(key) or default)
    except ValueError:
        raise VoiceError("invalid", f"{key} must be a whole number, got "
                         f"{form[key][:16]!r}") from None


def _bool(form: dict[str, str], key: str) -> bool:
    value = form.get(key, "").strip().lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise VoiceError("invalid", f"{key} must be true or false, got {value[:16]!r}")
    return value in ("1", "true", "yes", "on")
