"""The optional ASR step: audio parts become text for a model that cannot hear.

Configured by LLM_ASR_MODEL (a local HF speech-to-text checkpoint, e.g. Whisper); runs the
Transformers ASR pipeline on CPU or the configured device, one clip at a time in a worker
thread. An omni model (Qwen3-Omni on vLLM) never uses it: audio goes in as audio there.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from voice_llm.chat import SAMPLE_RATE, AudioClip

log = logging.getLogger(__name__)


class Transcriber:
    def __init__(self, model_path: Path, device: str = "cpu") -> None:
        self._path = model_path
        self._device = device
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self._pipe: Any = None

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load)

    def _load(self) -> None:
        from transformers import pipeline

        self._pipe = pipeline(
            "automatic-speech-recognition", model=str(self._path), device=self._device
        )
        log.info("ASR model loaded from %s", self._path)

    async def transcribe(self, clip: AudioClip) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, clip)

    def _run(self, clip: AudioClip) -> str:
        out = self._pipe({"raw": clip.samples, "sampling_rate": SAMPLE_RATE})
        return str(out["text"]).strip()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
