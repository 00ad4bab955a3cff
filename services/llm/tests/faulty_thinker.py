"""`python faulty_thinker.py`: the real thinker (`python -m voice_llm.server`) whose model
raises the error torch raises after a CUDA device fault, from its `LLM_TEST_FAULT_AT`-th
forward pass on (the warm-up takes a few), for test_server.py."""

from __future__ import annotations

import os

from voice_llm.backends import transformers_backend
from voice_llm.server import main

FAULT = RuntimeError("CUDA error: an illegal memory access was encountered")


def inject(at: int) -> None:
    load = transformers_backend.TransformersBackend._load

    def faulty_load(self) -> None:
        load(self)
        forward, calls = self.model.forward, [0]

        def faulty(*args, **kw):
            calls[0] += 1
            if calls[0] >= at:
                raise FAULT
            return forward(*args, **kw)

        self.model.forward = faulty

    transformers_backend.TransformersBackend._load = faulty_load


if __name__ == "__main__":
    inject(int(os.environ["LLM_TEST_FAULT_AT"]))
    main()
