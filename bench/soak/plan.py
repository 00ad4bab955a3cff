"""What the soak sends: English sentences, text pieces and the arrivals' plans."""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass

_WORD_TEXT = (
    "the a an this that every some our your their one two three many few small large "
    "quick slow bright dark quiet loud early late new old simple careful happy busy "
    "morning evening river mountain city garden window kitchen station market library "
    "engineer teacher driver doctor pilot farmer writer student neighbour traveller "
    "voice signal message answer question story picture letter number minute second "
    "weather music coffee breakfast journey meeting project system network server "
    "walks runs reads writes builds finds keeps sends brings watches listens speaks "
    "opens closes carries follows answers explains remembers forgets chooses waits "
    "today tomorrow yesterday again always never often sometimes quickly slowly "
    "carefully quietly together almost really still only just also very rather "
    "with without under over through across behind beside before after around near "
    "and but so because while although when where if then"
)
WORDS = _WORD_TEXT.split()
CLOSERS = ".", ".", ".", "?", "!"


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    """One English sentence of lo..hi characters from the word list."""
    target = rng.randint(lo, hi)
    words: list[str] = []
    n = -1  # length of " ".join(words)
    while True:
        w = rng.choice(WORDS)
        if n + len(w) + 2 > target and n + 1 >= lo:  # +1 space, +1 closing mark
            break
        if words and rng.random() < 0.12:
            words[-1] += ","
            n += 1
        words.append(w)
        n += len(w) + 1
    text = " ".join(words)
    text = text[0].upper() + text[1:] + rng.choice(CLOSERS)
    return text[:hi]


def words(text: str) -> list[str]:
    """Text a word at a time, each with the spaces after it: "Hello, ", "world."."""
    return re.findall(r"\S+\s*", text)


def pieces(rng: random.Random, text: str, lo: int = 1, hi: int = 6) -> list[str]:
    """Text cut like an LLM streams it: pieces of lo..hi characters."""
    out, i = [], 0
    while i < len(text):
        k = rng.randint(lo, hi)
        out.append(text[i:i + k])
        i += k
    return out


@dataclass
class Plan:
    """What one arrival does (drawn up front from the seeded generator)."""

    index: int
    at: float                      # arrival time, seconds from the start
    kind: str                      # normal | stop | reset | cancel
    voice: str
    language: str
    seed: int
    text: str
    max_frames: int
    action_frac: float             # when the action fires, as a share of the audio
    text2: str = ""                # RESET: the new sentence
    max_frames2: int = 0
    piece_seed: int = 0


def read_prompts(path: str) -> list[str]:
    """One prompt per line (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f]
    prompts = [ln for ln in lines if ln]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def make_plans(a: argparse.Namespace, voices: list[tuple[str, list[str]]]) -> list[Plan]:
    rng = random.Random(a.seed)
    prompts = read_prompts(a.prompts) if a.prompts else None

    def text_of() -> str:
        return rng.choice(prompts) if prompts else sentence(rng, a.min_chars, a.max_chars)

    plans: list[Plan] = []
    t = 0.0
    while True:
        t += rng.expovariate(a.rate)
        if t >= a.duration:
            break
        u = rng.random()
        kind = ("stop" if u < a.stop_share else
                "reset" if u < a.stop_share + a.reset_share else
                "cancel" if u < a.stop_share + a.reset_share + a.cancel_share else "normal")
        voice, langs = rng.choice(voices)
        text = text_of()
        text2 = text_of() if kind == "reset" else ""
        plans.append(Plan(
            index=len(plans), at=t, kind=kind, voice=voice, language=rng.choice(langs),
            seed=rng.randrange(2**31), text=text,
            max_frames=max(1, round(len(text) * a.frames_per_char)),
            action_frac=rng.uniform(0.05, 0.6), text2=text2,
            max_frames2=max(1, round(len(text2) * a.frames_per_char)) if text2 else 0,
            piece_seed=rng.randrange(2**31)))
    return plans
