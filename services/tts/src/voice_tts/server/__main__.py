"""`python -m voice_tts.server`: run the TTS gRPC service (configured by TTS_* env vars)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import ValidationError

from voice_tts.settings import TTSSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m voice_tts.server",
        description="Qwen3-TTS streaming gRPC service (voice.tts.v1.TextToSpeech). "
        "Configured by environment variables; see services/tts/README.md.",
        epilog="Variables: " + ", ".join(
            f"TTS_{k.upper()} (default {f.default!r})" for k, f in TTSSettings.model_fields.items()
        ),
    )
    parser.parse_args(argv)
    try:
        settings = TTSSettings()
    except ValidationError as e:
        sys.exit(f"bad TTS configuration:\n{e}")
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    from voice_tts.server.server import serve  # heavy imports (torch) after --help

    try:
        if settings.uvloop:
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(serve(settings))
        else:
            asyncio.run(serve(settings))
    except RuntimeError as e:
        sys.exit(f"tts: {e}")


if __name__ == "__main__":
    main()
