"""The gRPC side of the TTS service (`python -m voice_tts.server`)."""
