"""Process start-up warm-ups: lazy state that would otherwise be built during a reply.

livekit-agents' transcript synchronizer times each word of a reply by its syllables
(`tokenize.basic.hyphenate_word`, Liang's hyphenator). The hyphenator builds its
pattern tree (~4,500 patterns) on first use, synchronously on the event loop: the first
reply of every agent process stalled the loop 13 ms on an idle CPU and 100-225 ms on the
busy 2-core mesh, while the speaker's 20 ms playout and the VAD waited. Its speaking-rate
detector imports `numpy.fft` on its first window (another ~6 ms). Warming runs the same
calls once, at start-up (worker prewarm, `--direct`, `serve-direct`,
`DirectSession.start`); later calls hit the built tree. Idempotent and cheap once done.

This module knows nothing of sessions; it only touches the framework's process caches.
"""

from __future__ import annotations

import logging
import time
from functools import cache

import numpy as np
from livekit.agents import tokenize
from livekit.agents.tts._provider_format import strip_all_markup

log = logging.getLogger("voice_agent.warmup")

# Words long enough to be hyphenated (the hyphenator returns words of <= 4 letters as is).
_SAMPLE = "Warming the transcript timing: syllables, punctuation, numbers 42."



@cache  # once per process
def warm_transcript_timing() -> float:
    """Build the transcript synchronizer's lazy state now; returns the ms that took."""
    t0 = time.perf_counter()
    # The synchronizer's own calls (`_calc_hyphens`, `_reestimate_speed`): its word
    # tokenizer with these options, then the hyphenator per word.
    words = tokenize.basic.WordTokenizer(retain_format=True, ignore_punctuation=False,
                                         split_character=True).tokenize(
        strip_all_markup(_SAMPLE))
    for word in words:
        tokenize.basic.hyphenate_word(word)
    np.fft.rfft(np.zeros(600, np.float32))  # the speaking-rate STFT (25 ms at 24 kHz)
    ms = (time.perf_counter() - t0) * 1e3
    log.info("transcript timing warmed in %.0f ms", ms)
    return ms
