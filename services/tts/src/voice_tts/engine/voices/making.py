"""Making voices: a `VoicePrompt` from reference audio (Base: a clone) or a description
(VoiceDesign: a design), and its device form, `LibraryVoice`, that a session's prompt
reads. Eager float32, off the hot path, on the calling thread: what it makes on CUDA is
finished before it is handed over (`_hand_over`), so the engine's own stream may read it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..audio_features import to_24k
from ..model import Qwen3TTS
from ..model_type import ModelType
from ..text import TextTokenizer
from .prompt import IclPrompt, LibraryVoice, VoicePrompt

# Frames a reference leaves free in a session's slot (its prompt holds the reference's
# codes and transcript; offline, all of the text too).
ROOM_AFTER_REFERENCE = 256


class VoiceMaker:
    """Prompts for one model: `from_audio`, `from_description`, and `library_voice`."""

    def __init__(self, model: Qwen3TTS, tokenizer: TextTokenizer, dtype: torch.dtype,
                 max_seq_len: int) -> None:
        self.model, self.cfg, self.tokenizer = model, model.cfg, tokenizer
        self.device = next(model.parameters()).device
        self.dtype, self.max_seq_len = dtype, max_seq_len

    @property
    def model_type(self) -> ModelType:
        return self.cfg.tts_model_type

    def from_audio(self, audio: np.ndarray, sample_rate: int, ref_text: str = "",
                   x_vector_only: bool = False) -> VoicePrompt:
        """A clone of a reference recording (Base checkpoints): its x-vector and, unless
        `x_vector_only` or without a transcript, its codes for in-context cloning. Mono
        (or channels last, averaged) at any rate."""
        if not self.cfg.can_clone:
            raise ValueError(f"voice cloning needs a {ModelType.BASE} checkpoint; this one is "
                             f"{self.model_type}")
        from ..model.speaker_encoder import x_vector
        from ..model.speech_encoder import reference_codes

        wav = resample_24k(audio, sample_rate)
        icl = not x_vector_only and bool(ref_text.strip())
        return VoicePrompt(x_vector=x_vector(self.model, wav),
                           ref_codes=reference_codes(self.model, wav) if icl else None,
                           ref_text=ref_text if icl else "")

    def from_description(self, description: str) -> VoicePrompt:
        """A designed voice (VoiceDesign checkpoints): the description is its instruct."""
        if self.model_type != ModelType.VOICE_DESIGN:
            raise ValueError(f"voice design needs a {ModelType.VOICE_DESIGN} checkpoint; this "
                             f"one is {self.model_type}")
        prompt = VoicePrompt(instruct=description)
        prompt.check(self.model_type)
        return prompt

    @torch.no_grad()
    def library_voice(self, prompt: VoicePrompt) -> LibraryVoice:
        """The prompt on the device, ready for sessions. ValueError: a prompt of another
        model type, an x-vector of another size, reference codes that do not fit."""
        prompt.check(self.model_type)
        if prompt.x_vector is None:
            voice = LibraryVoice(prompt, instruct_ids=self.tokenizer.instruct_ids(
                prompt.instruct))
        else:
            vec = torch.as_tensor(np.asarray(prompt.x_vector, dtype=np.float32))
            hidden = self.cfg.talker.hidden_size
            if vec.shape != (hidden,):
                raise ValueError(f"x-vector of shape {tuple(vec.shape)}; the talker needs "
                                 f"({hidden},)")
            voice = LibraryVoice(prompt, vec.to(self.device, self.dtype), self._icl(prompt))
        self._hand_over()
        return voice

    def _icl(self, prompt: VoicePrompt) -> IclPrompt | None:
        if prompt.ref_codes is None:
            return None
        codes = torch.as_tensor(np.asarray(prompt.ref_codes, dtype=np.int64),
                                device=self.device)
        groups = self.cfg.code_predictor.num_code_groups
        size = self.cfg.speech_decoder.codebook_size
        if codes.shape[1] != groups or int(codes.min()) < 0 or int(codes.max()) >= size:
            raise ValueError(f"reference codes must be (T, {groups}) in 0..{size - 1}")
        ref_ids = self.tokenizer.ref_ids(prompt.ref_text)
        if len(codes) + len(ref_ids) + ROOM_AFTER_REFERENCE > self.max_seq_len:
            raise ValueError(f"reference of {len(codes)} frames and {len(ref_ids)} transcript "
                             f"ids is too long for max_seq_len {self.max_seq_len}")
        return IclPrompt(ref_ids, icl_codec_rows(self.model, codes), codes)

    def _hand_over(self) -> None:
        """Made on this thread's stream, read on the engine's, which does not wait for
        it: finished here (a few small kernels, once per voice)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def icl_codec_rows(model: Qwen3TTS, ref_codes: torch.Tensor) -> torch.Tensor:
    """Reference codes (T, 16) -> their codec-track rows (T, H), summed as the official
    `generate_icl_prompt` sums them (stacked (T, 16, H), then sum over the 16)."""
    talker = model.talker
    embeds = [talker.codec_embed(ref_codes[:, :1])]
    embeds += [talker.code_predictor.model.codec_embedding[i - 1](ref_codes[:, i:i + 1])
               for i in range(1, ref_codes.shape[1])]
    return torch.cat(embeds, dim=1).sum(1)


def resample_24k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 at 24 kHz as the official code makes it: channels (last axis)
    averaged, then `audio_features.to_24k` (bit-equal to its `librosa.resample`, length
    included)."""
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim > 1:
        wav = wav.mean(axis=-1).astype(np.float32)
    if wav.ndim != 1 or not len(wav):
        raise ValueError("reference audio must be a non-empty mono (or channels-last) array")
    return to_24k(wav, int(sample_rate))
