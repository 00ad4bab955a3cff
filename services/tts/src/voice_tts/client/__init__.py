"""A small async client of voice.tts.v1 (used by the CLI, the demo and the benchmarks)."""

from voice_tts.client.api import SynthesisResult, list_voices, synthesize

__all__ = ["SynthesisResult", "list_voices", "synthesize"]
