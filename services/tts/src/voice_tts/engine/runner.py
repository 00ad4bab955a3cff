"""The model runner: tensors, caches and the steps. It never decides who runs.

Three entry points, each a thin wrapper around a pure function of tensors:

- `prefill(req)`: one session's prompt (B=1, T=prompt length) into its talker KV slot,
  then codebook 0 of frame 0. The prompt is built exactly as the official `generate`
  builds it (same projection batches, so the same rounding).
- `decode(rows)`: ONE talker step for B sessions at once (continuous batching): for each
  row the code predictor completes the frame of the previous codebook-0 token (15 codes,
  `predict_frame`), the 16 codec embeddings plus the next text-track embedding feed the
  talker, which samples codebook 0 of the next frame (`talker_step`). Both are pure
  functions of tensors (no host sync, no branch on tensor values, fixed trip counts):
  the parts that part 2 captures in CUDA graphs. (CPU wall-clock timings per part; on
  CUDA they measure launch time unless the caller synchronizes.)
- `decode_audio(codes, state)`: a packet of frames through the streaming speech decoder.

Caches: the talker's static KV cache is indexed by session slot (slots, kv_heads,
max_seq_len, head_dim); the code predictor's is per frame and indexed by batch row; the
repetition-penalty "seen" mask is per slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .graphs import DecodeGraphs, buckets_for
from .model import DecoderState, Qwen3TTS
from .sampling import (
    SamplingParams,
    SamplingTensors,
    suppress_mask,
    talker_scores,
    warp_and_sample,
)


@dataclass
class PrefillRequest:
    slot: int
    role_ids: list[int]  # [im_start, "assistant", "\n"]
    codec_prefix: list[int]  # [nothink, think_bos, think_eos] or [think, think_bos, lang, eos]
    speaker_id: int | None
    text_ids: list[int]  # streaming: the first text id; offline: all text ids
    non_streaming: bool = False
    instruct_ids: list[int] | None = None


@dataclass
class DecodeRow:
    """One session's inputs to a talker step (host side)."""

    slot: int
    position: int  # talker position of this step's input row
    last_token: torch.Tensor  # (1,) codebook 0 of the frame to complete
    past_hidden: torch.Tensor  # (1, H) talker hidden state that produced it
    text_id: int  # next text-track id (text, tts_eos or tts_pad)
    n_generated: int  # codebook-0 tokens sampled so far in this utterance
    sampling: SamplingParams
    generator: torch.Generator


def _sampling_tensors(params: list[SamplingParams], sub: bool, vocab: int,
                      device) -> SamplingTensors:
    def col(name: str) -> list:
        return [getattr(p, ("subtalker_" if sub else "") + name) for p in params]

    top_k = [k if 0 < k < vocab else vocab for k in col("top_k")]
    return SamplingTensors(
        do_sample=torch.tensor(col("do_sample"), dtype=torch.bool, device=device),
        temperature=torch.tensor(col("temperature"), dtype=torch.float32, device=device),
        top_k=torch.tensor(top_k, dtype=torch.long, device=device),
        top_p=torch.tensor(col("top_p"), dtype=torch.float32, device=device))


def _noise(do_sample: bool, gen: torch.Generator, shape: tuple[int, ...], device) -> torch.Tensor:
    if not do_sample:
        return torch.ones(shape, device=device)
    return torch.empty(shape, device=device).exponential_(generator=gen)


def predict_frame(model: Qwen3TTS, last_token: torch.Tensor, past_hidden: torch.Tensor,
                  cp_p: SamplingTensors,
                  cp_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Code predictor for B rows: [talker hidden, embedding of codebook 0], then 14 single
    steps. last_token (B,), past_hidden (B, H), cp_noise (B, 15, V_cp) -> (frame codes
    (B, 16), sum of the frame's 16 codec embeddings (B, 1, H): the talker's codec track)."""
    talker, cp = model.talker, model.talker.code_predictor
    first = talker.codec_embed(last_token)[:, None]  # (B, 1, H)
    x = torch.cat((past_hidden[:, None], first), dim=1)  # (B, 2, H)
    pos = torch.arange(2, device=x.device)[None].expand(x.shape[0], -1)
    codes, embeds = [last_token], [first]
    for i in range(cp.cfg.num_code_groups - 1):
        logits = cp(x, pos, head=i).float()
        code = warp_and_sample(logits, cp_p, cp_noise[:, i])
        codes.append(code)
        x = cp.model.codec_embedding[i](code)[:, None]  # (B, 1, H)
        embeds.append(x)
        pos = pos[:, -1:] + 1
    # Same reduction as the official step: stack the 16 embeddings, sum over the stack.
    return torch.stack(codes, dim=1), torch.cat(embeds, dim=1).sum(1, keepdim=True)


def talker_step(model: Qwen3TTS, codec_track: torch.Tensor, text_ids: torch.Tensor,
                slots: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor,
                n_generated: torch.Tensor, penalty: torch.Tensor, talker_p: SamplingTensors,
                talker_noise: torch.Tensor, suppress: torch.Tensor, eos_id: int,
                kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One talker step for B rows: codec track (B, 1, H) + text track of text_ids (B,) at
    positions (B,) -> (codebook-0 token of the next frame (B,), hidden state (B, H))."""
    talker = model.talker
    x = codec_track + talker.text_embed(text_ids[:, None])
    logits, hidden = talker(x, slots, positions[:, None], kv_len)
    scores = talker_scores(logits[:, -1].float(), seen, penalty, n_generated, suppress, eos_id)
    return warp_and_sample(scores, talker_p, talker_noise), hidden[:, -1]


class Runner:
    def __init__(self, model: Qwen3TTS, max_sessions: int, max_seq_len: int) -> None:
        self.model, self.cfg = model, model.cfg
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        t = self.cfg.talker
        # One slot more than sessions: the scratch slot that padding rows of a graphed
        # batch write to (never read by a real session).
        self.scratch_slot = max_sessions
        model.talker.setup_caches(max_sessions + 1, max_seq_len, self.dtype, self.device)
        model.talker.code_predictor.setup_caches(max_sessions, self.dtype, self.device)
        self.max_seq_len = max_seq_len
        self.seen = torch.zeros(max_sessions + 1, t.vocab_size, dtype=torch.bool,
                                device=self.device)
        self.suppress = suppress_mask(t.vocab_size, t.codec_eos_token_id, self.device)
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda":
            # cuDNN's SDPA spends ~0.7 ms of CPU per call building its plan: ~100 calls a
            # step made the step CPU-bound (measured on an H100). Flash/efficient kernels
            # have no such cost.
            torch.backends.cuda.enable_cudnn_sdp(False)

    def enable_graphs(self, max_batch: int) -> None:
        """Capture the decode step for batch buckets 1, 2, 4 ... max_batch (CUDA only)."""
        self.graphs = DecodeGraphs(self, buckets_for(min(max_batch, self.scratch_slot)))
        self.graphs.capture()

    def step_tensors(self, st: dict, kv_len: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pure decode step over a dict of tensors (eager, or captured in a graph)."""
        t = self.cfg.talker
        frame, codec_track = predict_frame(self.model, st["last_token"], st["past_hidden"],
                                           st["cp_p"], st["cp_noise"])
        token, hidden = talker_step(
            self.model, codec_track, st["text_ids"], st["slots"], st["positions"],
            st["seen"], st["n_generated"], st["penalty"], st["talker_p"],
            st["talker_noise"], self.suppress, t.codec_eos_token_id, kv_len)
        return frame, token, hidden

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def prompt_embeds(self, req: PrefillRequest) -> torch.Tensor:
        """(1, L, H): the official prompt layout (see `Qwen3TTSForConditionalGeneration.
        generate`), with the same projection batches."""
        c, t = self.cfg, self.cfg.talker
        talker = self.model.talker
        tts_bos, tts_eos, tts_pad = talker.text_embed(
            self._ids([c.tts_bos_token_id, c.tts_eos_token_id, c.tts_pad_token_id])
        ).chunk(3, dim=1)
        parts = [talker.codec_embed(self._ids(req.codec_prefix))]
        if req.speaker_id is not None:
            parts.append(talker.codec_embed(
                torch.tensor(req.speaker_id, device=self.device)).view(1, 1, -1))
        parts.append(talker.codec_embed(self._ids([t.codec_pad_id, t.codec_bos_id])))
        codec = torch.cat(parts, dim=1)
        role = talker.text_embed(self._ids(req.role_ids))
        body = torch.cat((tts_pad.expand(-1, codec.shape[1] - 2, -1), tts_bos), dim=1)
        x = torch.cat((role, body + codec[:, :-1]), dim=1)
        if not req.non_streaming:
            x = torch.cat((x, talker.text_embed(self._ids(req.text_ids[:1])) + codec[:, -1:]),
                          dim=1)
        else:
            n = len(req.text_ids)
            text = torch.cat((talker.text_embed(self._ids(req.text_ids)), tts_eos), dim=1)
            x = torch.cat((x, text + talker.codec_embed(self._ids([t.codec_pad_id] * (n + 1))),
                           tts_pad + talker.codec_embed(self._ids([t.codec_bos_id]))), dim=1)
        if req.instruct_ids:
            x = torch.cat((talker.text_embed(self._ids(req.instruct_ids)), x), dim=1)
        return x

    @torch.no_grad()
    def prefill(self, req: PrefillRequest, sampling: SamplingParams,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        """-> (codebook-0 token of frame 0 (1,), talker hidden (1, H), prompt length)."""
        x = self.prompt_embeds(req)
        length = x.shape[1]
        if length >= self.max_seq_len:
            raise ValueError(f"prompt of {length} rows does not fit max_seq_len "
                             f"{self.max_seq_len}")
        slots = torch.tensor([req.slot], device=self.device)
        positions = torch.arange(length, device=self.device)[None]
        logits, hidden = self.model.talker(x, slots, positions, length)
        self.seen[req.slot] = False
        t = self.cfg.talker
        p = torch.tensor([sampling.repetition_penalty], device=self.device)
        scores = talker_scores(logits[:, -1].float(), self.seen[slots], p,
                               torch.zeros(1, dtype=torch.long, device=self.device),
                               self.suppress, t.codec_eos_token_id)
        noise = _noise(sampling.do_sample, gen, (1, t.vocab_size), self.device)
        token = warp_and_sample(scores, _sampling_tensors([sampling], False, t.vocab_size,
                                                          self.device), noise)
        self.seen[req.slot, token] = True
        return token, hidden[:, -1], length

    @torch.no_grad()
    def decode(self, rows: list[DecodeRow]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One talker step for `rows` -> (frames (B, 16), next tokens (B,), hidden (B, H))."""
        dev, t = self.device, self.cfg.talker
        v_cp, n_cp = self.cfg.code_predictor.vocab_size, self.cfg.code_predictor.num_code_groups
        slots = torch.tensor([r.slot for r in rows], device=dev)
        positions = torch.tensor([r.position for r in rows], device=dev)
        params = [r.sampling for r in rows]
        # Noise per row from the row's own generator: code predictor first, then talker,
        # in the order the official step samples them.
        cp_noise = torch.stack([_noise(r.sampling.subtalker_do_sample, r.generator,
                                       (n_cp - 1, v_cp), dev) for r in rows])
        talker_noise = torch.stack([_noise(r.sampling.do_sample, r.generator,
                                           (t.vocab_size,), dev) for r in rows])
        st = {
            "last_token": torch.cat([r.last_token for r in rows]),
            "past_hidden": torch.cat([r.past_hidden for r in rows]),
            "cp_p": _sampling_tensors(params, True, v_cp, dev), "cp_noise": cp_noise,
            "text_ids": torch.tensor([r.text_id for r in rows], device=dev),
            "slots": slots, "positions": positions, "seen": self.seen[slots],
            "n_generated": torch.tensor([r.n_generated for r in rows], device=dev),
            "penalty": torch.tensor([p.repetition_penalty for p in params], device=dev),
            "talker_p": _sampling_tensors(params, False, t.vocab_size, dev),
            "talker_noise": talker_noise,
        }
        t0 = time.perf_counter()
        if self.graphs is not None and self.graphs.bucket(len(rows)) is not None:
            frame, token, hidden = self.graphs.run(st)
            self.timing = {"code_predictor_ms": 0.0,
                           "talker_ms": (time.perf_counter() - t0) * 1e3}
        else:
            frame, codec_track = predict_frame(self.model, st["last_token"],
                                               st["past_hidden"], st["cp_p"], st["cp_noise"])
            t1 = time.perf_counter()
            token, hidden = talker_step(
                self.model, codec_track, st["text_ids"], slots, positions, st["seen"],
                st["n_generated"], st["penalty"], st["talker_p"], talker_noise,
                self.suppress, t.codec_eos_token_id, int(positions.max()) + 1)
            self.timing = {"code_predictor_ms": (t1 - t0) * 1e3,
                           "talker_ms": (time.perf_counter() - t1) * 1e3}
        self.seen[slots, token] = True
        return frame, token, hidden

    @torch.no_grad()
    def decode_audio(self, frames: torch.Tensor, state: DecoderState | None) -> np.ndarray:
        """frames (T, 16) -> float32 PCM (T * frame_samples,); advances `state`."""
        codes = frames.T[None].to(self.device)  # (1, 16, T)
        pcm = self.model.speech_decoder(codes, state)
        return pcm[0].float().cpu().numpy()


