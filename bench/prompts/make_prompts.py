"""Writes bench/prompts/en_read_1088.txt: the open-loop benchmark's English prompts.

1,088 sentences, as many as the English test set of Seed-TTS (read sentences from Common
Voice) that Nari's Qwen3-TTS benchmark sends, with its length profile: mostly 40-150
characters. The words are drawn from the soak's English word list (bench/soak/plan.py),
not copied from any corpus, so the set ships freely; with random weights only the length
matters (it sets the text tokens and, through sampling.max_frames, the spoken length).
Lengths: a log-normal target, median 88 characters, sigma 0.40, clipped to 24-220; each
sentence ends on a whole word up to 12 characters short of it. Deterministic (seed 0).

Also writes en_read_1088_first_word_one_token.txt: the same sentences opened by "The" or
"A". The random-weight presets tokenize with a small demo BPE (engine/demo_tokenizer.py)
that splits most words into several tokens; the real Qwen2 vocabulary makes most English
words one token. Streaming a word at a time, a first word of one token is the case that
shows when speech can start (`bench.openloop --stream-text words`).

    python -m bench.prompts.make_prompts          # rewrite the files, print their statistics
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

from bench.soak.plan import sentence

OUT = Path(__file__).with_name("en_read_1088.txt")
OUT_ONE_TOKEN = Path(__file__).with_name("en_read_1088_first_word_one_token.txt")
COUNT, MEDIAN, SIGMA, LO, HI = 1088, 88.0, 0.40, 24, 220


def make(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(COUNT):
        n = min(HI, max(LO, round(math.exp(rng.gauss(math.log(MEDIAN), SIGMA)))))
        # A window below n lets the sentence end on a whole word and its closing mark;
        # the rare one cut short of its mark is drawn again.
        while (text := sentence(rng, max(LO, n - 12), n))[-1] not in ".?!":
            pass
        out.append(text)
    return out


def first_word_one_token(lines: list[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(("The", "A")) + " " + s.split(" ", 1)[1] for s in lines if " " in s]


def stats(lines: list[str]) -> str:
    lens = sorted(len(s) for s in lines)
    q = statistics.quantiles(lens, n=20)
    share = sum(40 <= n <= 150 for n in lens) / len(lens)
    return (f"{len(lens)} sentences, characters: min {lens[0]}, p5 {q[0]:.0f}, median "
            f"{statistics.median(lens):.0f}, mean {statistics.fmean(lens):.1f}, p95 "
            f"{q[-1]:.0f}, max {lens[-1]}; {share:.0%} within 40-150")


if __name__ == "__main__":
    lines = make()
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{OUT}: {stats(lines)}")
    OUT_ONE_TOKEN.write_text("\n".join(first_word_one_token(lines)) + "\n")
