"""`python -m voice_tts.client`: speak text through a TTS server and write a WAV.

  python -m voice_tts.client --text "Hello there." --out reply.wav
  some_llm | python -m voice_tts.client --stdin --out reply.wav   # streams as it arrives
  python -m voice_tts.client --chat "Hi!" --thinker localhost:50052  # thinker -> TTS
  python -m voice_tts.client voices create me --audio me.wav --ref-text "..."  # library
  python -m voice_tts.client --text "Hi." --voice me     # a library voice, by name
  python -m voice_tts.client --text "Hi." --ref-audio me.wav  # inline, nothing stored

Prints client-side TTFA and RTF (and the server's TTFA). Headless: no audio playback.

A server with random weights (a `preset:` model: noise, not speech) gets a short cap on
each utterance unless --max-frames says otherwise, so a demo ends in seconds; the
thinker's reply is printed with what a terminal cannot show (the bytes a random
thinker writes) as "·".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc
from voice.tts.v1 import tts_pb2

from voice_tts.client.api import list_voices, synthesize

# Codec frames (12.5 a second) an utterance of a random-weight TTS may last: 4 s of noise
# shows the stream works; its guard (from the text length) would allow minutes.
RANDOM_MAX_FRAMES = 50
UNREADABLE = "·"


def _readable(text: str) -> str:
    """`text` as a terminal shows it: replacement and control characters as ·."""
    return "".join(c if (c.isprintable() and c != "\ufffd") or c == "\n" else UNREADABLE
                   for c in text)


def _split(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)] or [""]


async def _stdin_pieces(n: int) -> AsyncIterator[str]:
    """Reads stdin as it arrives (not line by line) and yields pieces of <= n chars."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending = b""
    while chunk := await reader.read(256):
        pending += chunk
        try:
            text, pending = pending.decode(), b""
        except UnicodeDecodeError:  # a character split across reads: wait for the rest
            continue
        for piece in _split(text, n):
            yield piece


async def _thinker_pieces(addr: str, question: str, key: str = "") -> AsyncIterator[str]:
    """The thinker's reply, delta by delta, as it streams (echoed to stdout)."""
    meta = (("authorization", f"Bearer {key}"),) if key else ()
    async with grpc.aio.insecure_channel(addr) as ch:
        req = thinker_pb2.ChatRequest(messages=[thinker_pb2.Message(
            role=thinker_pb2.ROLE_USER, parts=[thinker_pb2.Part(text=question)])])
        print("thinker: ", end="", flush=True)
        babble = False
        async for delta in thinker_pb2_grpc.ThinkerStub(ch).Chat(req, metadata=meta):
            if delta.text:
                shown = _readable(delta.text)
                babble = babble or UNREADABLE in shown
                print(shown, end="", flush=True)
                yield delta.text
            if delta.HasField("final"):
                note = (f"; {UNREADABLE} = bytes that are no text: random weights babble"
                        if babble else "")
                print(f"\n[thinker: {delta.final.completion_tokens} tokens, "
                      f"TTFT {delta.final.ttft_ms:.1f} ms{note}]")


async def _run(args: argparse.Namespace) -> int:
    async with grpc.aio.insecure_channel(args.addr) as ch:
        if args.list_voices:
            v = await list_voices(ch, args.api_key)
            for voice in v.voices:
                print(f"{voice.name}\t{voice.kind or 'preset'}\t{','.join(voice.languages)}"
                      f"\t{voice.dialect}")
            print(f"languages: {', '.join(v.languages)}  model: {v.model}")
            return 0
        model = (await list_voices(ch, args.api_key)).model
        if model.startswith("preset:") and not args.max_frames:
            args.max_frames = RANDOM_MAX_FRAMES
            print(f"tts: {model} has RANDOM WEIGHTS: the audio is noise, "
                  f"{RANDOM_MAX_FRAMES / 12.5:.0f} s at most (--max-frames to change)")
        cfg = tts_pb2.SessionConfig(voice=args.voice, language=args.language,
                                    sample_rate=args.rate, frame_ms=args.frame_ms,
                                    instruct=args.instruct)
        if args.ref_audio is not None:  # inline: a clone for this session only
            cfg.voice = ""
            cfg.reference.CopyFrom(tts_pb2.ReferenceAudio(
                audio=args.ref_audio.read_bytes(), ref_text=args.ref_text))
        if args.seed is not None:
            cfg.seed = args.seed
        if args.greedy:
            cfg.sampling.greedy = True
        if args.max_frames:
            cfg.sampling.max_frames = args.max_frames
        if args.chat:
            pieces: object = _thinker_pieces(args.thinker, args.chat, args.thinker_api_key)
        elif args.stdin:
            pieces = _stdin_pieces(args.chunk_chars)
        else:
            pieces = _split(args.text, args.chunk_chars)
        res = await synthesize(ch, pieces, cfg, interval_s=args.interval_ms / 1e3,  # type: ignore[arg-type]
                               api_key=args.api_key)
    with wave.open(args.out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(res.sample_rate)
        w.writeframes(res.pcm)
    ttfa = f"{res.ttfa_s * 1e3:.1f} ms" if res.ttfa_s is not None else "n/a"
    # in the unit --max-frames counts: codec frames of 80 ms (the messages are 20 ms frames)
    print(f"wrote {args.out}: {res.audio_s:.2f} s at {res.sample_rate} Hz, "
          f"{res.audio_s * 12.5:.0f} codec frames of 80 ms "
          f"({res.frames} frames of {args.frame_ms} ms)")
    print(f"TTFA {ttfa} (server {res.server_ttfa_ms or 0:.1f} ms)  RTF {res.rtf:.3f}")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["voices"]:  # the voice library: voices list / create / get / delete
        from voice_tts.client.voices import run

        try:
            sys.exit(asyncio.run(run(argv[1:])))
        except grpc.aio.AioRpcError as e:
            sys.exit(f"tts error: {e.code().name}: {e.details()}")
    p = argparse.ArgumentParser(prog="python -m voice_tts.client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="text to speak")
    src.add_argument("--stdin", action="store_true", help="stream text from stdin")
    src.add_argument("--chat", metavar="QUESTION", help="ask the thinker, speak its answer")
    src.add_argument("--list-voices", action="store_true", help="print voices and exit")
    p.add_argument("--out", default="reply.wav", help="WAV file to write (default reply.wav)")
    p.add_argument("--addr", default="localhost:50051", help="server host:port")
    p.add_argument("--thinker", default="localhost:50052", help="thinker host:port (--chat)")
    p.add_argument("--voice", default="vivian")
    p.add_argument("--ref-audio", type=Path, help="inline reference audio (a WAV) for a "
                   "clone of this request only (Base servers; --voice is then ignored)")
    p.add_argument("--ref-text", default="", help="--ref-audio's transcript")
    p.add_argument("--language", default="auto")
    p.add_argument("--instruct", default="")
    p.add_argument("--rate", type=int, default=24000, help="16000, 24000 or 48000")
    p.add_argument("--frame-ms", type=int, default=20, help="10, 20 or 40")
    p.add_argument("--seed", type=int)
    p.add_argument("--greedy", action="store_true", help="deterministic argmax decoding")
    p.add_argument("--max-frames", type=int, default=0,
                   help="cap each utterance at this many codec frames of 80 ms (0: the server's)")
    p.add_argument("--chunk-chars", type=int, default=4, help="characters per text piece")
    p.add_argument("--interval-ms", type=float, default=0.0, help="pause between pieces")
    p.add_argument("--api-key", default=os.environ.get("TTS_API_KEY", ""),
                   help="for a server with TTS_API_KEYS (default: $TTS_API_KEY)")
    p.add_argument("--thinker-api-key", default=os.environ.get("LLM_API_KEY", ""),
                   help="for a thinker with LLM_API_KEYS (--chat; default: $LLM_API_KEY)")
    args = p.parse_args(argv)
    if not (args.text or args.stdin or args.chat or args.list_voices):
        p.error("give --text, --stdin, --chat or --list-voices")
    try:
        sys.exit(asyncio.run(_run(args)))
    except grpc.aio.AioRpcError as e:
        sys.exit(f"tts error: {e.code().name}: {e.details()}{_next_step(e, args)}")


def _next_step(e: grpc.aio.AioRpcError, args: argparse.Namespace) -> str:
    """What to do about it, for the errors a newcomer meets first."""
    if e.code() == grpc.StatusCode.UNAVAILABLE:
        return (f"\n  nothing answers at {args.addr}{' or ' + args.thinker if args.chat else ''}"
                ": is the stack up? `make up` starts it (TTS_GRPC_PORT / LLM_GRPC_PORT if "
                "you moved its ports)")
    if e.code() == grpc.StatusCode.UNAUTHENTICATED:
        return ("\n  the server asks for an API key: --api-key / TTS_API_KEY (the thinker's: "
                "--thinker-api-key / LLM_API_KEY); `make up` wrote compose's into .env "
                "(VOICE_API_KEY)")
    return ""


if __name__ == "__main__":
    main()
