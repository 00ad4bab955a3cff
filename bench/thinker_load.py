"""The thinker under chat load: `--concurrency` conversations, each sending its next Chat
as soon as the last reply has streamed, for `--duration` s, against a running thinker.

Each request is a voice agent's turn: a conversation history of about `--prompt-words`
words (a long prompt, so its prefill is the GPU burst a real thinker makes) and a short
reply of `--max-tokens` tokens, streamed. Measured per request: time to the first text
delta (client side) and the server's own TTFT (`final.ttft_ms`); decode rate (completion
tokens after the first / the time after it). Per run: p50/p95 of each, requests, tokens
per second over the run, errors by status. One JSON object on stdout (and `--out`).

  python -m bench.thinker_load --addr 127.0.0.1:50052 --concurrency 16 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter

import grpc
from voice.llm.v1 import thinker_pb2 as pb
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc

_TEXT = ("the weather is nice today and we could walk in the park or call a friend later "
         "please tell me the time of the next train to the city and what I should bring "
         "for dinner with my family on the weekend if it rains again")
WORDS = _TEXT.split()


def history(rng: random.Random, words: int) -> list[pb.Message]:
    """Turns of random words, alternating user / assistant, ending with the user."""
    msgs: list[pb.Message] = []
    left, role = words, pb.ROLE_USER
    while left > 0:
        n = min(left, rng.randint(20, 60))
        text = " ".join(rng.choice(WORDS) for _ in range(n)) + "."
        msgs.append(pb.Message(role=role, parts=[pb.Part(text=text)]))
        left -= n
        role = pb.ROLE_ASSISTANT if role == pb.ROLE_USER else pb.ROLE_USER
    if msgs[-1].role != pb.ROLE_USER:
        msgs.append(pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text="And then?")]))
    return msgs


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    ttft, server_ttft, rate, tokens = [], [], [], [0]
    errors: Counter[str] = Counter()
    end = time.monotonic() + args.duration
    async with grpc.aio.insecure_channel(args.addr) as ch:
        stub = pb_grpc.ThinkerStub(ch)

        async def conversation(i: int) -> None:
            await asyncio.sleep(i * args.stagger)
            while time.monotonic() < end:
                req = pb.ChatRequest(messages=history(rng, args.prompt_words),
                                     max_tokens=args.max_tokens, temperature=0.7, seed=i)
                t0 = time.perf_counter()
                first = None
                try:
                    async for d in stub.Chat(req, timeout=120):
                        now = time.perf_counter()
                        if d.text and first is None:
                            first = now
                        if d.HasField("final"):
                            f = d.final
                            tokens[0] += f.completion_tokens
                            server_ttft.append(f.ttft_ms)
                            if first is not None:
                                ttft.append((first - t0) * 1e3)
                                if f.completion_tokens > 1 and now > first:
                                    rate.append((f.completion_tokens - 1) / (now - first))
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] += 1
                    await asyncio.sleep(0.5)

        t_start = time.monotonic()
        await asyncio.gather(*(conversation(i) for i in range(args.concurrency)))
        wall = time.monotonic() - t_start
    return {
        "concurrency": args.concurrency, "duration_s": round(wall, 1),
        "prompt_words": args.prompt_words, "max_tokens": args.max_tokens,
        "requests": len(server_ttft), "errors": dict(errors),
        "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p95": pct(ttft, 0.95),
        "server_ttft_ms_p50": pct(server_ttft, 0.5), "server_ttft_ms_p95": pct(server_ttft, 0.95),
        "decode_tok_s_per_request_p50": pct(rate, 0.5),
        "tokens_per_s": round(tokens[0] / wall, 1) if wall else None,
        "ttft_ms_mean": round(statistics.fmean(ttft), 2) if ttft else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:50052")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of requests")
    p.add_argument("--prompt-words", type=int, default=600, help="history length in words")
    p.add_argument("--max-tokens", type=int, default=64, help="reply length")
    p.add_argument("--stagger", type=float, default=0.1, help="s between conversations' starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON here too")
    args = p.parse_args()
    res = asyncio.run(run(args))
    print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if not res["requests"] or res["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
