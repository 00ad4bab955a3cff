"""voice_token: the LiveKit token service and the voice demo web page."""

__version__ = "0.1.0"
