"""An omni thinker (Qwen2.5-Omni's) as the batcher's model: audio in, text out.

Qwen2.5-Omni's thinker is an audio encoder (Whisper-large-like) whose outputs replace the
`<|AUDIO|>` placeholder tokens' embeddings in the prompt, then a Qwen2.5 decoder with
multimodal RoPE (M-RoPE: three position axes). This module does what HF's processor and
`generate` do for it, cut so the batcher can drive it:
- `prepare` (any thread): a request's clips -> log-mel features (the processor's
  WhisperFeatureExtractor, built from the config: nothing downloaded), its prompt ids with
  each placeholder expanded to its clip's token count, and its M-RoPE positions and rope
  delta (`get_rope_index`, the model's own).
- `embed` (the batcher's thread): one audio-encoder call for every clip of a prefill's
  rows, scattered into the rows' placeholder embeddings.
- `forward`: the decoder + LM head, with the batcher's keyword arguments, on ids or
  embeddings.
After the prompt a row's text position is its token index + its rope delta (M-RoPE gives
audio and images their own time axis, so the two part); the batcher adds the delta to
every decode step's positions, a row at a time. The KV cache is indexed by token index.

It knows nothing about requests, slots or sampling. Qwen3-Omni's MoE thinker has the same
parts under other names; not wired yet.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from voice_llm.chat import SAMPLE_RATE, AudioClip

OMNI_THINKERS = {"qwen2_5_omni_thinker"}
# The processor's mel frames are 10 ms hops of 25 ms windows (Whisper's); padding a clip
# with over a window's worth of zeros past its last hop gives its frames exactly the
# values the processor's 30 s zero padding gives (the log-mel's floor is set by the
# loudest frame, which zeros never are), for a fraction of the STFT work.
_HOP, _N_FFT = 160, 400


def is_omni_thinker(config: Any) -> bool:
    return getattr(config, "model_type", None) in OMNI_THINKERS


def thinker_class(config: Any) -> type:
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    assert is_omni_thinker(config), f"{config.model_type} is not an omni thinker"
    return Qwen2_5OmniThinkerForConditionalGeneration


@dataclass
class AudioPrompt:
    """One request's audio as the model takes it, made off the batcher's thread."""

    features: torch.Tensor  # (clips, mel, frames) float32, zero-padded to the longest clip
    frames: torch.Tensor  # (clips,) long: each clip's mel frames
    positions: torch.Tensor  # (3, T) long: the prompt's M-RoPE positions
    rope_delta: int  # text position - token index, after the prompt


def audio_frames(n_samples: int) -> int:
    """Mel frames the processor gives a clip (its attention mask: a frame per started hop)."""
    return math.ceil(n_samples / _HOP)


def audio_tokens(frames: int) -> int:
    """Prompt tokens a clip of `frames` mel frames takes: the encoder's two stride-2 steps
    (its conv, then its pooling), as `_get_feat_extract_output_lengths` counts them."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


class OmniThinker:
    def __init__(self, model: Any, tokenizer: Any) -> None:
        from transformers import WhisperFeatureExtractor

        self.thinker = model
        self.config = model.config.get_text_config()  # what the SlotCache sizes itself by
        self.device, self.dtype = model.device, model.dtype
        # transformers 5.17 keeps the decoder at .model, 5.24 at .model.language_model;
        # both answer get_decoder().
        self._decoder = model.get_decoder()
        self._lm_head = model.get_output_embeddings()
        self._embed = model.get_input_embeddings()
        params = inspect.signature(self._decoder.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        c = model.config
        self.audio_id = c.audio_token_id
        start, end = c.audio_start_token_id, c.audio_end_token_id
        # The chat template's audio item ("<|audio_bos|><|AUDIO|><|audio_eos|>"); the single
        # <|AUDIO|> then becomes one per audio token, as the processor does.
        self.placeholder = "".join(tokenizer.convert_ids_to_tokens([start, self.audio_id, end]))
        self._features = WhisperFeatureExtractor(
            feature_size=c.audio_config.num_mel_bins, sampling_rate=SAMPLE_RATE,
            hop_length=_HOP, n_fft=_N_FFT)

    def prepare(self, clips: Sequence[AudioClip], ids: list[int]) -> tuple[list[int], AudioPrompt]:
        """Clips + prompt ids with one placeholder token a clip -> the ids with each
        placeholder expanded, and the audio the prefill needs."""
        frames = [audio_frames(len(c.samples)) for c in clips]
        at = [i for i, t in enumerate(ids) if t == self.audio_id]
        assert len(at) == len(clips), f"{len(at)} audio placeholders for {len(clips)} clips"
        expanded: list[int] = []
        last = 0
        for i, f in zip(at, frames, strict=True):
            expanded += ids[last:i] + [self.audio_id] * audio_tokens(f)
            last = i + 1
        expanded += ids[last:]
        longest = max(frames)
        mels = []
        for clip, f in zip(clips, frames, strict=True):
            pad = (longest + 1) * _HOP + _N_FFT  # zeros past the last hop's window
            mel = self._features(np.asarray(clip.samples, dtype=np.float32), padding="max_length",
                                 max_length=pad, sampling_rate=SAMPLE_RATE,
                                 return_tensors="pt").input_features[0, :, :longest]
            mel[:, f:] = 0.0  # frames past the clip are masked out; keep them inert
            mels.append(mel)
        frames_t = torch.tensor(frames)
        ids_t = torch.tensor([expanded])
        positions, delta = self.thinker.get_rope_index(
            input_ids=ids_t, attention_mask=torch.ones_like(ids_t), audio_seqlens=frames_t)
        return expanded, AudioPrompt(torch.stack(mels), frames_t, positions[:, 0],
                                     int(delta.reshape(-1)[0]))

    def embed(self, ids: torch.Tensor, audio: Sequence[AudioPrompt]) -> torch.Tensor:
        """ids (R, T) + the audio of the rows that have some, in row order -> (R, T, H),
        each placeholder's embedding replaced by its audio token's encoding."""
        embeds = self._embed(ids)
        if not audio:
            return embeds
        longest = max(a.features.shape[-1] for a in audio)
        pad = torch.nn.functional.pad
        features = torch.cat([pad(a.features, (0, longest - a.features.shape[-1])) for a in audio])
        features = features.to(self.device, self.dtype)  # (clips, mel, frames)
        frames = torch.cat([a.frames for a in audio]).to(self.device)
        mask = torch.arange(longest, device=self.device)[None] < frames[:, None]
        out = self.thinker.get_audio_features(features, feature_attention_mask=mask.long())
        encoded = out if isinstance(out, torch.Tensor) else out.last_hidden_state  # (N, H)
        slots = ids == self.audio_id
        assert int(slots.sum()) == encoded.shape[0], "audio tokens != placeholders"
        return embeds.masked_scatter(slots[..., None], encoded.to(embeds.dtype))

    def forward(self, *, position_ids: torch.Tensor, attention_mask: Any, cache: Any,
                input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                use_cache: bool = True, logits_to_keep: torch.Tensor | None = None) -> Any:
        """The batcher's model call: position_ids (R, T) text positions (the decoder
        repeats them on its three axes) or (3, R, T); logits at `logits_to_keep` (a
        position a row) or everywhere."""
        hidden = self._decoder(input_ids=input_ids, inputs_embeds=inputs_embeds,
                               position_ids=position_ids, attention_mask=attention_mask,
                               use_cache=use_cache, **{self._cache_arg: cache}).last_hidden_state
        if logits_to_keep is not None:
            hidden = hidden[:, logits_to_keep]
        return SimpleNamespace(logits=self._lm_head(hidden))

    __call__ = forward
