"""Voice agent: LiveKit Agents worker with our thinker/TTS plugins (see README.md)."""
