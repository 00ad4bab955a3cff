"""The hearing thinker's TTFT: a user turn sent as audio vs the same turn as text.

In-process, through the thinker's own Transformers backend (continuous batching, CUDA
graphs for decode), on an omni thinker with random weights at a released shape
(`random:qwen2.5-omni-7b`: Qwen2.5-Omni-7B's thinker, its audio encoder included). No
gRPC: the server's protocol layer adds the same small cost to both modes, and this
measures what the GPU does with audio in.

`--conversations` N conversations each send a turn, stream the reply (`--max-tokens`),
pause a random 0-1 s (the user's next turn) and send the next, for `--seconds`. Each turn
is the system prompt + one user turn, either a `--audio-s` s clip (speech-like noise; the
encoder's cost does not depend on what is said) or its text (the words such a clip holds:
2.5 words a second). TTFT is the time from `generate` to the first token's chunk. Both
modes run on the same model, one after the other, at each N. One JSON line a run, then a
table.

  python -m bench.omni_thinker --shape qwen2.5-omni-7b --conversations 1,16,64,128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from voice_llm.backends.transformers_backend import TransformersBackend
from voice_llm.chat import AudioClip, ChatJob, ChatMessage, Role, SamplingOptions
from voice_llm.settings import Settings
from voice_llm.tiny_random import ensure_random_shape

SYSTEM = ("You are a friendly voice assistant. Answer in one or two short spoken sentences, "
          "no lists, no markdown.")
WORDS = [
    "the", "weather", "is", "nice", "today", "and", "we", "could", "walk", "in", "the",
    "park", "or", "call", "a", "friend", "later", "please", "tell", "me", "the", "time",
    "of", "the", "next", "train", "to", "the", "city",
]


def turn_audio(seconds: float, rng: np.random.Generator) -> AudioClip:
    """Noise shaped like speech's loudness (syllables at ~4 Hz): the encoder's work is the
    clip's length, not its words."""
    t = np.arange(int(seconds * 16000)) / 16000
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    return AudioClip((0.2 * envelope * rng.standard_normal(t.size)).astype(np.float32))


def turn_text(seconds: float, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(round(2.5 * seconds))) + "?"


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def run_level(backend: TransformersBackend, n: int, mode: str, args: argparse.Namespace,
                    seed: int) -> dict:
    rng_np, rng = np.random.default_rng(seed), random.Random(seed)
    clips = [turn_audio(args.audio_s, rng_np) for _ in range(8)]
    texts = [turn_text(args.audio_s, rng) for _ in range(8)]
    ttft: list[float] = []
    tokens, prompt_tokens, errors = 0, [], 0
    deadline = time.monotonic() + args.seconds
    options = SamplingOptions(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0)

    async def conversation(c: int) -> None:
        nonlocal tokens, errors
        k = 0
        await asyncio.sleep(rng.random())  # callers do not all start on the same step
        while time.monotonic() < deadline:
            user = (clips[(c + k) % 8],) if mode == "audio" else (texts[(c + k) % 8],)
            job = ChatJob(f"{mode}-{n}-{c}-{k}", (ChatMessage(Role.SYSTEM, (SYSTEM,)),
                                                   ChatMessage(Role.USER, user)), options)
            t0, first = time.perf_counter(), None
            try:
                async for chunk in backend.generate(job):
                    if first is None and chunk.new_tokens:
                        first = time.perf_counter() - t0
                    tokens += chunk.new_tokens
                    if chunk.finish is not None:
                        prompt_tokens.append(chunk.prompt_tokens)
            except Exception:
                errors += 1
            if first is not None:
                ttft.append(first * 1000)
            k += 1
            await asyncio.sleep(rng.random())

    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(c) for c in range(n)))
    wall = time.perf_counter() - t0
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "shape": args.shape, "mode": mode, "conversations": n, "turns": len(ttft),
            "prompt_tokens": statistics.median(prompt_tokens) if prompt_tokens else None,
            "ttft_p50_ms": round(pct(ttft, 50), 1), "ttft_p95_ms": round(pct(ttft, 95), 1),
            "ttft_max_ms": round(max(ttft), 1) if ttft else None,
            "tokens_per_s": round(tokens / wall, 1), "errors": errors}


async def main(args: argparse.Namespace) -> None:
    path = ensure_random_shape(Path(args.cache_dir), args.shape)
    levels = [int(x) for x in args.conversations.split(",")]
    settings = Settings(backend="transformers", model=f"random:{args.shape}",
                        cache_dir=Path(args.cache_dir), device=args.device,
                        max_concurrent=max(levels), max_model_len=args.max_model_len,
                        max_tokens_limit=args.max_model_len - 1)
    t0 = time.perf_counter()
    backend = TransformersBackend(settings, path)
    await backend.start()
    print(f"# loaded {args.shape} (accepts_audio={backend.accepts_audio}) in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for n in levels:
        for mode in ("text", "audio"):
            await run_level(backend, 1, mode, argparse.Namespace(**{**vars(args), "seconds": 1}),
                            0)  # warm-up: the encoder's first shapes
            row = await run_level(backend, n, mode, args, seed=n)
            print(json.dumps(row), flush=True)
            rows.append(row)
    await backend.close()
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("\n| GPU | shape | N | mode | prompt tok | turns | TTFT p50 ms | p95 ms | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['gpu']} | {r['shape']} | {r['conversations']} | {r['mode']} | "
              f"{r['prompt_tokens']} | {r['turns']} | {r['ttft_p50_ms']} | {r['ttft_p95_ms']} | "
              f"{r['tokens_per_s']} |")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--shape", default="qwen2.5-omni-7b", help="random:<shape> (tiny_omni.py)")
    p.add_argument("--conversations", default="1,16,64,128", help="levels, comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="per level and mode")
    p.add_argument("--audio-s", type=float, default=3.0, help="the user turn's length")
    p.add_argument("--max-tokens", type=int, default=24, help="reply tokens a turn")
    p.add_argument("--max-model-len", type=int, default=512, help="KV slots' length")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cache-dir", default="/tmp/voice-llm-cache")
    p.add_argument("--out", default="", help="JSON lines here too")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
