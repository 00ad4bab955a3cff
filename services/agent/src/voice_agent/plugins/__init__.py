"""Our livekit-agents plugins: STT and LLM over the thinker, streaming TTS over gRPC.

They follow the framework's plugin interfaces only, so any AgentSession can use them:
`AgentSession(stt=STT(...), llm=LLM(...), tts=TTS(...), vad=silero.VAD.load())`.
"""

from .llm import LLM, LLMStream
from .stt import STT
from .tts import TTS, SynthesizeStream

__all__ = ["LLM", "STT", "TTS", "LLMStream", "SynthesizeStream"]
