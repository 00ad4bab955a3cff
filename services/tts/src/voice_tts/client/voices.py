r"""`python -m voice_tts.client voices ...`: the server's voice library over gRPC.

  python -m voice_tts.client voices list
  python -m voice_tts.client voices create alice --audio alice.wav --ref-text "Hello, it is me."
  python -m voice_tts.client voices create bob --audio bob.raw --format pcm_s16le \
      --sample-rate 44100 --channels 2
  python -m voice_tts.client voices create narrator --description "A calm, deep voice."
  python -m voice_tts.client voices get alice
  python -m voice_tts.client voices delete alice
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from voice_tts.client.api import key_metadata

FORMATS = {"wav": tts_pb2.ReferenceAudio.FORMAT_WAV,
           "pcm_s16le": tts_pb2.ReferenceAudio.FORMAT_PCM_S16LE,
           "pcm_f32le": tts_pb2.ReferenceAudio.FORMAT_PCM_F32LE}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m voice_tts.client voices", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="localhost:50051", help="server host:port")
    p.add_argument("--api-key", default=os.environ.get("TTS_API_KEY", ""),
                   help="for a server with TTS_API_KEYS (default: $TTS_API_KEY)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every voice: presets and the library's")
    for name in ("get", "delete"):
        sub.add_parser(name, help=f"{name} one voice").add_argument("name")
    c = sub.add_parser("create", help="a voice from reference audio or a description")
    c.add_argument("name", help="[A-Za-z0-9_-]{1,64}")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--audio", type=Path, help="reference audio: a WAV file, or raw PCM")
    src.add_argument("--description", help="a designed voice (VoiceDesign servers)")
    c.add_argument("--ref-text", default="", help="the reference's transcript (in-context)")
    c.add_argument("--x-vector-only", action="store_true", help="the speaker embedding only")
    c.add_argument("--format", choices=sorted(FORMATS), default="wav")
    c.add_argument("--sample-rate", type=int, default=0, help="raw PCM only")
    c.add_argument("--channels", type=int, default=1, help="raw PCM only")
    return p


def _show(v: tts_pb2.Voice) -> str:
    extra = [f"{v.duration_s:.1f} s" if v.duration_s else "",
             "x-vector only" if v.x_vector_only and v.kind == "clone" else "",
             f"ref_text={v.ref_text!r}" if v.ref_text else "",
             f"description={v.description!r}" if v.description else "",
             *v.warnings]
    return "\t".join([v.name, v.kind or "preset", *[e for e in extra if e]])


async def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    meta = key_metadata(args.api_key)
    async with grpc.aio.insecure_channel(args.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        if args.command == "list":
            for v in (await stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=meta)).voices:
                print(_show(v))
        elif args.command == "get":
            print(_show((await stub.GetVoice(tts_pb2.GetVoiceRequest(name=args.name),
                                             metadata=meta)).voice))
        elif args.command == "delete":
            await stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(name=args.name), metadata=meta)
            print(f"deleted {args.name}")
        else:
            req = tts_pb2.CreateVoiceRequest(name=args.name)
            if args.description is not None:
                req.description = args.description
            else:
                req.reference.CopyFrom(tts_pb2.ReferenceAudio(
                    audio=args.audio.read_bytes(), format=FORMATS[args.format],
                    sample_rate=args.sample_rate, channels=args.channels,
                    ref_text=args.ref_text, x_vector_only=args.x_vector_only))
            made = await stub.CreateVoice(req, metadata=meta, timeout=300)
            print(f"created {_show(made.voice)}")
    return 0
