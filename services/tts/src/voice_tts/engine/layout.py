"""The prompt's layout: what a session's prompt is made of (`PrefillRequest`, built by the
scheduler) and its rows as the official `generate` lays them out (`prompt_rows`, run by
the runner): text and codec ids per row plus, for cloned voices, vectors added to some
rows (the x-vector in the speaker row, the reference frames' summed codec embeddings in
the in-context rows). Both the scheduler and the runner import it; it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .config import ModelConfig
from .voices import IclPrompt


@dataclass
class PrefillRequest:
    slot: int
    role_ids: list[int]  # [im_start, "assistant", "\n"]
    codec_prefix: list[int]  # [nothink, think_bos, think_eos] or [think, think_bos, lang, eos]
    speaker_id: int | None
    # streaming: the first text id (in-context: the first Ly - Lr, fewer = the whole text);
    # offline: all text ids
    text_ids: list[int]
    non_streaming: bool = False
    instruct_ids: list[int] | None = None
    speaker_vec: torch.Tensor | None = None  # (H,) a clone's x-vector: the speaker row
    icl: IclPrompt | None = None  # an in-context clone's reference rows


class PromptRows(NamedTuple):
    """A prompt as rows: each row is text_embed(text id) + codec_embed(codec id) (-1 =
    absent) + the vectors of `extra` that fall on it."""

    text: list[int]
    codec: list[int]
    extra: list[tuple[int, torch.Tensor]]  # (first row, vectors (n, H)): x-vector, ICL rows


def prompt_rows(cfg: ModelConfig, req: PrefillRequest) -> PromptRows:
    """The official prompt layout (`Qwen3TTSForConditionalGeneration.generate`): optional
    instruct rows, the role, the codec prefix (+ speaker row, + pad) under tts_pad, bos
    under tts_bos, then the text: the first text id over codec bos (streaming), the whole
    text over codec pad then tts_pad over bos (offline), or the in-context rows."""
    t = cfg.talker
    speaker = [] if req.speaker_id is None and req.speaker_vec is None else [
        -1 if req.speaker_id is None else req.speaker_id]
    codec = [*req.codec_prefix, *speaker, t.codec_pad_id, t.codec_bos_id]
    text = [*req.role_ids, *[cfg.tts_pad_token_id] * (len(codec) - 2), cfg.tts_bos_token_id]
    codecs = [-1] * len(req.role_ids) + codec[:-1]
    extra = [] if req.speaker_vec is None else [(len(codecs) - 2, req.speaker_vec[None])]
    if req.icl is not None:
        _icl_rows(cfg, req, text, codecs, extra)
    elif not req.non_streaming:
        text.append(req.text_ids[0])
        codecs.append(codec[-1])
    else:
        n = len(req.text_ids)
        text += [*req.text_ids, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
        codecs += [t.codec_pad_id] * (n + 1) + [t.codec_bos_id]
    if req.instruct_ids:
        n = len(req.instruct_ids)
        text, codecs = [*req.instruct_ids, *text], [-1] * n + codecs
        extra = [(row + n, vecs) for row, vecs in extra]
    return PromptRows(text, codecs, extra)


def _icl_rows(cfg: ModelConfig, req: PrefillRequest, text: list[int], codecs: list[int],
              extra: list[tuple[int, torch.Tensor]]) -> None:
    """Append the in-context rows (`generate_icl_prompt`): text track X = reference ids,
    target ids, tts_eos; codec track Y = bos, the reference frames. Streaming: X over Y
    row by row (X cut at Ly, or padded with tts_pad); offline: X over codec pad, then Y
    under tts_pad."""
    icl, pad = req.icl, cfg.tts_pad_token_id
    x = [*icl.ref_ids, *req.text_ids]
    ly = icl.codec_len
    if req.non_streaming or len(x) < ly:  # the whole text is here: it ends with tts_eos
        x.append(cfg.tts_eos_token_id)
    if req.non_streaming:
        text += [*x, *[pad] * ly]
        codecs += [cfg.talker.codec_pad_id] * len(x)
    else:
        text += (x + [pad] * ly)[:ly]
    codecs.append(cfg.talker.codec_bos_id)
    extra.append((len(codecs), icl.codec_rows))
    codecs += [-1] * (ly - 1)
