"""Plain-PyTorch modules of Qwen3-TTS-12Hz: one file per part, no sessions, no sampling."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .code_predictor import CodePredictor
from .speaker_encoder import SpeakerEncoder
from .speech_decoder import DecoderSlots, DecoderState, SpeechDecoder
from .speech_encoder import SpeechEncoder
from .talker import Talker


class Qwen3TTS(nn.Module):
    """The whole model: `talker` (with its `code_predictor`) and the `speech_decoder`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker, CodePredictor(cfg.code_predictor,
                                                       cfg.talker.hidden_size))
        self.speech_decoder = SpeechDecoder(cfg.speech_decoder)
        # Base (voice clone) only, as the official model: the
        # x-vector of a reference voice.
        self.speaker_encoder: SpeakerEncoder | None = (
            SpeakerEncoder(cfg.speaker_encoder) if cfg.can_clone else None)
        # Base only too: the speech tokenizer's encoder, for in-context reference codes.
        self.speech_encoder: SpeechEncoder | None = (
            SpeechEncoder(cfg.speech_encoder) if cfg.can_clone else None)


__all__ = ["CodePredictor", "DecoderSlots", "DecoderState", "Qwen3TTS", "SpeakerEncoder",
           "SpeechDecoder", "SpeechEncoder", "Talker"]
