"""`python faulty_server.py`: the real TTS server (`python -m voice_tts.server`) with a
fault injected into the engine's decode steps, for test_faults.py.

TTS_TEST_FAULT=<kind>@<n>: the n-th step launch raises (kind `cuda`: the RuntimeError
torch raises after an illegal memory access, which poisons the device; kind `bug`: a
ValueError, which does not) or never returns (kind `hang`).
"""

from __future__ import annotations

import os
import time

from voice_tts.engine.runner import Runner
from voice_tts.server.__main__ import main

ERRORS = {"cuda": RuntimeError("CUDA error: an illegal memory access was encountered"),
          "bug": ValueError("injected bookkeeping bug")}


def inject(spec: str) -> None:
    kind, n = spec.split("@")
    launch, calls = Runner.launch, [0]

    def faulty(self, slots, text_ids):
        calls[0] += 1
        if calls[0] == int(n):
            if kind == "hang":
                time.sleep(3600)
            raise ERRORS[kind]
        return launch(self, slots, text_ids)

    Runner.launch = faulty


if __name__ == "__main__":
    inject(os.environ["TTS_TEST_FAULT"])
    main()
