"""Sweep sampling seeds through a running server's OpenAI speech endpoint and count what
comes back: every seed must give audio (issue: seed 5260's "Hi." drew an id its
filters had removed and the call ended 500).

    python -m bench.seed_sweep --url http://127.0.0.1:8001 --seeds 0:20000 --concurrency 16

A call turned away (429: the server is at capacity) is retried after a short pause, as a
client honouring Retry-After would; the retries are counted apart. Prints progress every
1,000 calls and a JSON summary (statuses, the failing seeds and
their messages); exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter

import aiohttp


def _range(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start), int(stop))


async def _one(session: aiohttp.ClientSession, url: str, body: dict, seed: int
               ) -> tuple[int, int, str]:
    async with session.post(url, json={**body, "seed": seed}) as r:
        data = await r.read()
        return r.status, len(data), "" if r.status == 200 else data[:300].decode(errors="replace")


async def sweep(args: argparse.Namespace) -> dict:
    seeds = _range(args.seeds)
    body = {"model": "tts-1", "voice": args.voice, "input": args.text,
            "response_format": "pcm"}
    url = args.url.rstrip("/") + "/v1/audio/speech"
    statuses: Counter[int] = Counter()
    retries = 0
    failed: list[dict] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for s in seeds:
        queue.put_nowait(s)
    t0, done = time.monotonic(), 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, retries
        while not queue.empty():
            seed = queue.get_nowait()
            while True:
                try:
                    status, size, message = await _one(session, url, body, seed)
                except aiohttp.ClientError as e:
                    status, size, message = -1, 0, f"{type(e).__name__}: {e}"
                if status != 429:
                    break
                retries += 1
                await asyncio.sleep(0.05)
            statuses[status] += 1
            if status != 200 or size == 0:
                failed.append({"seed": seed, "status": status, "message": message})
            done += 1
            if done % 1000 == 0:
                print(f"{done}/{len(seeds)} calls, {time.monotonic() - t0:.0f} s, "
                      f"{len(failed)} failed", file=sys.stderr, flush=True)

    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
    return {"url": url, "text": args.text, "voice": args.voice, "seeds": args.seeds,
            "calls": len(seeds), "retried_429": retries,
            "statuses": {str(k): v for k, v in statuses.items()},
            "failed": failed, "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8001", help="the server's HTTP base")
    p.add_argument("--seeds", default="0:20000", help="START:STOP (STOP excluded)")
    p.add_argument("--text", default="Hi.")
    p.add_argument("--voice", default="vivian")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--timeout-s", type=float, default=120.0, help="per call")
    p.add_argument("--out", help="also write the summary JSON here")
    args = p.parse_args()
    summary = asyncio.run(sweep(args))
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    sys.exit(1 if summary["failed"] else 0)


if __name__ == "__main__":
    main()
