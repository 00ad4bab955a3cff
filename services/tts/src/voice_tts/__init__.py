"""voice_tts: the Qwen3-TTS 12Hz streaming engine and its gRPC service."""
