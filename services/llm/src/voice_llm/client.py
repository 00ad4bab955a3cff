"""`python -m voice_llm.client --text "hi"`: one Chat call, the reply streamed to stdout.

Prints the text as it arrives, then a summary line on stderr with the client-side time to
the first delta, the server's own TTFT, token counts and the finish reason. `--wav` sends
a 16 kHz mono WAV file as an audio part of the user message.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import grpc
from voice.llm.v1 import thinker_pb2 as pb
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc


def build_request(args: argparse.Namespace) -> pb.ChatRequest:
    parts = []
    if args.wav:
        data = Path(args.wav).read_bytes()
        parts.append(
            pb.Part(audio=pb.AudioPart(data=data, format=pb.AUDIO_FORMAT_WAV, sample_rate=16000))
        )
    if args.text:
        parts.append(pb.Part(text=args.text))
    req = pb.ChatRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=parts)],
        max_tokens=args.max_tokens,
        system_prompt=args.system,
        stop=args.stop,
        request_id=args.request_id,
    )
    if args.temperature is not None:
        req.temperature = args.temperature
    if args.seed is not None:
        req.seed = args.seed
    return req


async def chat(args: argparse.Namespace) -> int:
    async with grpc.aio.insecure_channel(args.addr) as channel:
        stub = pb_grpc.ThinkerStub(channel)
        start = time.perf_counter()
        first: float | None = None
        try:
            meta = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else ()
            async for delta in stub.Chat(build_request(args), timeout=args.timeout,
                                         metadata=meta):
                if delta.text and first is None:
                    first = time.perf_counter()
                sys.stdout.write(delta.text)
                sys.stdout.flush()
                if delta.HasField("final"):
                    f = delta.final
                    client_ttft = ((first or time.perf_counter()) - start) * 1e3
                    print(
                        f"\n[{delta.request_id}] finish={pb.FinishReason.Name(f.finish_reason)} "
                        f"prompt_tokens={f.prompt_tokens} completion_tokens={f.completion_tokens}"
                        f" ttft_ms(server)={f.ttft_ms:.1f} ttft_ms(client)={client_ttft:.1f} "
                        f"total_ms={f.total_ms:.1f}",
                        file=sys.stderr,
                    )
        except grpc.aio.AioRpcError as e:
            print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m voice_llm.client", description=__doc__)
    p.add_argument("--addr", default="localhost:50052", help="thinker address host:port")
    p.add_argument("--text", default="", help="the user's message")
    p.add_argument("--wav", default="", help="a 16 kHz mono 16-bit WAV to send as audio")
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="0 = the server's LLM_DEFAULT_MAX_TOKENS (150; `make up`'s random "
                   "thinker: 32)")
    p.add_argument("--temperature", type=float, default=None, help="unset = server's 0.3")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--request-id", default="")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole call")
    p.add_argument("--api-key", default=os.environ.get("LLM_API_KEY", ""),
                   help="the thinker's API key, if it asks for one (default: $LLM_API_KEY)")
    args = p.parse_args(argv)
    if not args.text and not args.wav:
        p.error("give --text and/or --wav")
    sys.exit(asyncio.run(chat(args)))


if __name__ == "__main__":
    main()
