"""The model runner: tensors, caches and the steps. It never decides who runs.

Everything a session needs between steps lives on the device, one row per engine slot
(`SlotState`: newest codebook-0 token, talker hidden state, the codec track of the last
completed frame, position, frame counter, seed, sampling parameters, the
repetition-penalty "seen" mask; the talker KV cache; the speech decoder's streaming state,
`DecoderSlots`). So a decode step takes only small host lists (slots, next text-track
ids, whether each row talks) and is three pure functions of tensors:

- `step_talker(slots, text_ids, talk)`: rows that talk feed their last frame's codec
  track plus the next text-track embedding to the talker, which samples codebook 0 of a
  new frame (`talker_step`) and writes the rows' state back. A row's first step does not
  talk: the prompt already sampled codebook 0 of its frame 0, which needs only the first
  text id, so frame 0 is spoken before the second text id has arrived;
- `step_cp(slots)`: the code predictor completes the frame of each row's newest
  codebook-0 token (15 codes, `predict_frame`) and keeps its codec track for the next
  talker step;
- `step_decoder(slots, frame)`: the speech decoder turns the completed frame into 1920
  samples, streaming from each row's own decoder state. A row whose codebook 0 is no code
  (codec EOS: the utterance is over) decodes nothing (its row reads the scratch slot).

No host sync, no branch on tensor values, fixed trip counts: `graphs.py` captures each
part as a CUDA graph per batch-size bucket; `launch` returns a `Step` whose tokens come
before its audio (the decoder runs beside the next step). `prefill(reqs)` runs prompts
into their slots (`prefill_rows`: one batch per prompt length, or per length bucket as a
CUDA graph), each laid out by `layout.prompt_rows` (the official `generate`'s layout).
An in-context clone's speech decoder state first decodes its reference codes
(output dropped): its audio is the official decode of cat(reference, codes) after the
reference.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import fields
from functools import partial
from itertools import pairwise

import numpy as np
import torch

from . import kernels
from .graphs import PARTS, PROMPT_BUCKETS, DecodeGraphs, PrefillGraphs, buckets_for, fit
from .layout import PrefillRequest, PromptRows, prompt_rows
from .model import DecoderSlots, Qwen3TTS
from .sampling import (
    TALKER_STREAM,
    SamplingParams,
    SamplingTensors,
    exp_noise,
    suppress_mask,
    talker_scores,
    warp_and_sample,
)
from .voices import IclPrompt


class Step:
    """One launched decode step. `tokens()`: codebook 0 of the frame each row made (the
    prompt's, for a row's first step; codec EOS: the utterance is over, no frame), from
    the talker. `audio()`: (codes (B, 16) of that frame, its PCM (B, frame_samples)
    float32; garbage for a row whose token is EOS), from the speech decoder. Pipelined
    (CUDA graphs), the decoder is still running when the tokens are ready: the engine
    launches the next step before it reads this one's audio. `timing`: the part times
    (ms), set once the audio is read."""

    def __init__(self, tokens: Callable[[], list[int]], audio: Callable[[], tuple],
                 pipelined: bool) -> None:
        self._tokens_fn, self._audio_fn, self.pipelined = tokens, audio, pipelined
        self.launched_at = 0.0  # perf_counter at its launch (set by Runner.launch)
        self._tokens: list[int] | None = None
        self._audio: tuple[np.ndarray, np.ndarray] | None = None
        self.timing: dict[str, float] = {}

    def tokens(self) -> list[int]:
        if self._tokens is None:
            self._tokens = self._tokens_fn()
        return self._tokens

    def audio(self) -> tuple[np.ndarray, np.ndarray]:
        if self._audio is None:
            codes, pcm, self.timing = self._audio_fn()
            self._audio = codes, pcm
        return self._audio


class SlotSampling:
    """Sampling parameters per slot, (slots,) tensors; `rows(slots)` gathers a batch."""

    def __init__(self, n: int, vocab: int, device) -> None:
        self.vocab = vocab
        self.t = SamplingTensors(
            do_sample=torch.zeros(n, dtype=torch.bool, device=device),
            temperature=torch.ones(n, dtype=torch.float32, device=device),
            top_k=torch.full((n,), vocab, dtype=torch.long, device=device),
            top_p=torch.ones(n, dtype=torch.float32, device=device))

    def set_rows(self, slots: torch.Tensor,
                 rows: list[tuple[bool, float, int, float]]) -> None:
        """rows: (do_sample, temperature, top_k (0 = off), top_p) per slot."""
        do_sample, temperature, top_k, top_p = zip(*rows, strict=True)
        dev = slots.device
        self.t.do_sample[slots] = torch.tensor(do_sample, dtype=torch.bool, device=dev)
        self.t.temperature[slots] = torch.tensor(temperature, dtype=torch.float32, device=dev)
        self.t.top_k[slots] = torch.tensor([k if 0 < k < self.vocab else self.vocab
                                            for k in top_k], device=dev)
        self.t.top_p[slots] = torch.tensor(top_p, dtype=torch.float32, device=dev)

    def rows(self, slots: torch.Tensor) -> SamplingTensors:
        return SamplingTensors(**{f.name: getattr(self.t, f.name)[slots]
                                  for f in fields(SamplingTensors)})


class SlotState:
    """The talker-side state of every slot between steps (see the module docstring)."""

    def __init__(self, n: int, hidden: int, vocab: int, cp_vocab: int, dtype,
                 device) -> None:
        def zeros(*shape, dt=torch.long):
            return torch.zeros(shape, dtype=dt, device=device)

        self.last_token = zeros(n)  # codebook 0 of the newest frame
        self.past_hidden = zeros(n, hidden, dt=dtype)  # the talker's, at that token
        self.track = zeros(n, hidden, dt=dtype)  # codec track of the last completed frame
        self.position = zeros(n)  # talker position of the next step's input row
        self.n_generated = zeros(n)  # codebook-0 tokens sampled in this utterance
        self.seed = zeros(n)
        self.seen = zeros(n, vocab, dt=torch.bool)
        self.penalty = torch.ones(n, dtype=torch.float32, device=device)
        self.talker = SlotSampling(n, vocab, device)
        self.cp = SlotSampling(n, cp_vocab, device)


def predict_frame(model: Qwen3TTS, last_token: torch.Tensor, past_hidden: torch.Tensor,
                  sample: Callable[[int, torch.Tensor], torch.Tensor],
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Code predictor for B rows: [talker hidden, embedding of codebook 0], then 14 single
    steps; `sample(i, logits (B, V_cp))` picks codebook i + 1. last_token (B,), past_hidden
    (B, H) -> (frame codes (B, 16), sum of the frame's 16 codec embeddings (B, 1, H): the
    talker's codec track)."""
    talker, cp = model.talker, model.talker.code_predictor
    first = talker.codec_embed(last_token)[:, None]  # (B, 1, H)
    x = torch.cat((past_hidden[:, None], first), dim=1)  # (B, 2, H)
    codes, embeds, start = [last_token], [first], 0
    for i in range(cp.cfg.num_code_groups - 1):
        code = sample(i, cp(x, start, group=i))
        codes.append(code)
        x = cp.model.codec_embedding[i](code)[:, None]  # (B, 1, H)
        embeds.append(x)
        start = i + 2
    # Same reduction as the official step: stack the 16 embeddings, sum over the stack.
    return torch.stack(codes, dim=1), torch.cat(embeds, dim=1).sum(1, keepdim=True)


def talker_step(model: Qwen3TTS, codec_track: torch.Tensor, text_ids: torch.Tensor,
                slots: torch.Tensor, positions: torch.Tensor, kv_len: int,
                sample: Callable[[torch.Tensor], torch.Tensor],
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One talker step for B rows: codec track (B, 1, H) + text track of text_ids (B,) at
    positions (B,); `sample(logits (B, V))` picks codebook 0 -> (codebook-0 token of the
    next frame (B,), hidden state (B, H))."""
    talker = model.talker
    x = codec_track + talker.text_embed(text_ids[:, None])
    hidden = talker(x, slots, positions[:, None], kv_len)[:, -1]
    return sample(talker.logits(hidden)), hidden


class Runner:
    def __init__(self, model: Qwen3TTS, max_sessions: int, max_seq_len: int,
                 ignore_eos: bool = False) -> None:
        self.model, self.cfg = model, model.cfg
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        t, cp = self.cfg.talker, self.cfg.code_predictor
        # One slot more than sessions: the scratch slot that padding rows of a graphed
        # batch read and write (never a real session's).
        self.scratch_slot = n = max_sessions
        model.talker.setup_caches(n + 1, max_seq_len, self.dtype, self.device)
        model.talker.code_predictor.setup_caches(n + 1, self.dtype, self.device)
        self.max_seq_len = max_seq_len
        self.state = SlotState(n + 1, t.hidden_size, t.vocab_size, cp.vocab_size, self.dtype,
                               self.device)
        self.decoder_slots = DecoderSlots(model.speech_decoder, n + 1, self.device)
        self.suppress = suppress_mask(t.vocab_size, t.codec_eos_token_id, self.device)
        if ignore_eos:  # benchmarks: every stream runs to its frame cap
            self.suppress[t.codec_eos_token_id] = True
        self._cp_streams = torch.arange(cp.num_code_groups - 1, device=self.device)
        self._talker_stream = torch.tensor([TALKER_STREAM], device=self.device)
        self._true = torch.ones((), dtype=torch.bool, device=self.device)
        self._positions = [0] * (n + 1)  # host mirror of state.position (eager kv_len)
        self._arange = torch.arange(max(max_seq_len, n + 1), device=self.device)
        self.graphs: DecodeGraphs | None = None
        # Eager steps with the graphs' shapes (`mimic_graphs`): batch buckets, or None.
        self.eager_buckets: list[int] | None = None
        self._eager_pipelined = False
        # The engine's own CUDA stream, at high priority: the speech decoder's stream
        # (default priority) runs beside it and must not delay the critical path (code
        # predictor -> talker -> next frame).
        self.stream = (torch.cuda.Stream(self.device, priority=-1)
                       if self.device.type == "cuda" else None)
        self.prefill_graphs: PrefillGraphs | None = None
        # The fused Triton path (engine/kernels) wherever it can run: CUDA.
        self.fused = kernels.active(self.state.seed)
        if self.fused:
            for layer in (*model.talker.model.layers, *model.talker.code_predictor.model.layers):
                layer.fuse_projections()
            self._talker_masks = kernels.TalkerMasks(self.state.seen, self.state.penalty,
                                                     self.suppress, t.codec_eos_token_id)
        if self.device.type == "cuda":
            # cuDNN's SDPA spends ~0.7 ms of CPU per call building its plan: ~100 calls a
            # step made the step CPU-bound (measured on an H100). Flash/efficient kernels
            # have no such cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
            # The speech decoder's convolutions at each graph bucket's batch size: let cuDNN
            # time its algorithms once (at capture) instead of trusting its heuristics,
            # which picked a decoder 1.6x slower at batch 32 than at 64 (H100).
            torch.backends.cudnn.benchmark = True
            torch.cuda.synchronize(self.device)  # set-up work before the engine's stream

    def enable_graphs(self, max_batch: int, max_prefills: int) -> None:
        """Capture the decode step for batch buckets 1, 2, 4 ... max_batch and the prefill
        per (batch, prompt length) bucket (CUDA only)."""
        try:
            self.graphs = DecodeGraphs(self, buckets_for(min(max_batch, self.scratch_slot)))
            self.graphs.capture()
            self.prefill_graphs = PrefillGraphs(
                self, buckets_for(min(max_prefills, self.scratch_slot)),
                [n for n in PROMPT_BUCKETS if n < self.max_seq_len], self.graphs.pool)
            self.prefill_graphs.capture()
        except RuntimeError as e:
            # An allocation that fails inside a capture surfaces as "operation failed due
            # to a previous error during capture", not as out of memory (seen on a shared
            # H100 when the thinker took its KV cache while the TTS captured).
            free, total = torch.cuda.mem_get_info(self.device)
            raise RuntimeError(
                f"capturing the CUDA graphs failed with {free / 2**30:.1f} of "
                f"{total / 2**30:.1f} GiB free: if another process took the memory, lower "
                f"TTS_MAX_SESSIONS or its share, or start it after this one ({e})") from e

    def mimic_graphs(self, buckets: list[int] | None = None) -> None:
        """Run eager steps as the CUDA graphs run them: each batch padded to its bucket
        with rows on the scratch slot (none without `buckets`), and the audio of a step
        handed out one engine iteration later (pipelined). With the index checks of the
        eager path, this is the CPU reference for what padding rows and steps in flight
        do on the GPU."""
        self.eager_buckets = sorted(buckets) if buckets is not None else None
        self._eager_pipelined = True

    @property
    def pipelined(self) -> bool:
        """A step's audio is read one iteration after its launch (CUDA graphs, or eager
        steps mimicking them)."""
        return self.graphs is not None or self._eager_pipelined

    def on_stream(self) -> contextlib.AbstractContextManager:
        """Run the engine's work on its stream (CUDA), or as is."""
        return torch.cuda.stream(self.stream) if self.stream else contextlib.nullcontext()

    # --- the three parts of a decode step (pure functions of tensors) -----------------

    def reset_scratch(self) -> None:
        """Put the scratch slot back to a fresh state after each step. Every padding row of a
        bucket points at it, and a step advances it like a real row: left alone, its
        position grew by one per padded step until its KV write went past the cache
        (an illegal memory access under open-loop traffic, where batches rarely fill a
        bucket), and a codec EOS it sampled became codebook 0 of its next frame, out of
        the speech decoder's codebooks. Graph-safe: fills at a fixed index."""
        s, k = self.state, self.scratch_slot
        for t in (s.last_token, s.position, s.n_generated, s.past_hidden, s.track, s.seen):
            t[k].zero_()  # a kernel (`t[k] = 0` copies a host scalar: not capturable)

    def step_talker(self, slots: torch.Tensor, text_ids: torch.Tensor, talk: torch.Tensor,
                    kv_len: int) -> torch.Tensor:
        """Rows with talk (B,) 1: the talker steps from the codec track of their last
        frame and the next text id to codebook 0 of a new frame, and their state moves
        on. Rows with 0 (a first step) keep their state: their KV row at `position` is
        written and rewritten by their first real step before any query reads it.
        -> each row's newest codebook 0 (B,)."""
        s = self.state
        pos, n = s.position[slots], s.n_generated[slots]
        token, hidden = talker_step(self.model, s.track[slots][:, None], text_ids, slots, pos,
                                    kv_len, partial(self._sample_talker, slots, n))
        yes = talk.bool()
        token = torch.where(yes, token, s.last_token[slots])
        hidden = torch.where(yes[:, None], hidden, s.past_hidden[slots])
        s.last_token.index_copy_(0, slots, token)
        s.past_hidden.index_copy_(0, slots, hidden)
        s.position.index_copy_(0, slots, pos + talk)
        s.n_generated.index_copy_(0, slots, n + talk)
        s.seen.index_put_((slots, token), self._true)  # a device scalar: graph-safe
        return token

    def step_cp(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (frames (B, 16) of each row's newest codebook-0 token, the slots the decoder
        reads: the scratch slot for a row whose token is no code (EOS), its frame zeros).
        Keeps each frame's codec track for the row's next talker step."""
        s = self.state
        if self.fused:  # the frame being completed is n_generated - 1
            def sample(i: int, logits: torch.Tensor) -> torch.Tensor:
                return kernels.sample(logits, slots, s.cp.t, s.seed, s.n_generated, -1, i)
        else:
            noise = exp_noise(s.seed[slots], s.n_generated[slots] - 1, self._cp_streams,
                              self.cfg.code_predictor.vocab_size)
            p = s.cp.rows(slots)

            def sample(i: int, logits: torch.Tensor) -> torch.Tensor:
                return warp_and_sample(logits.float(), p, noise[:, i])
        first = s.last_token[slots]
        code = first < self.cfg.speech_decoder.codebook_size
        frame, track = predict_frame(self.model, first, s.past_hidden[slots], sample)
        s.track.index_copy_(0, slots, track[:, 0])
        self.reset_scratch()
        return frame * code[:, None], torch.where(code, slots, self.scratch_slot)

    def step_decoder(self, slots: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """frames (B, 16) -> float32 PCM (B, frame_samples), streamed per slot."""
        self.decoder_slots.frames[self.scratch_slot].zero_()  # padding rows: bounded positions
        return self.model.speech_decoder(frame[:, :, None], self.decoder_slots.rows(slots))

    def _sample_talker(self, slots: torch.Tensor, n: torch.Tensor,
                       logits: torch.Tensor) -> torch.Tensor:
        """Codebook 0 from logits (B, V) of rows whose utterances have sampled n (B,) =
        state.n_generated[slots] tokens (the fused kernel reads it there)."""
        s, t = self.state, self.cfg.talker
        if self.fused:
            return kernels.sample(logits, slots, s.talker.t, s.seed, s.n_generated, 0,
                                  TALKER_STREAM, self._talker_masks)
        scores = talker_scores(logits.float(), s.seen[slots], s.penalty[slots], n,
                               self.suppress, t.codec_eos_token_id)
        noise = exp_noise(s.seed[slots], n, self._talker_stream, t.vocab_size)[:, 0]
        return warp_and_sample(scores, s.talker.rows(slots), noise)

    # --- host entry points --------------------------------------------------------------

    @torch.no_grad()
    def embed_prompts(self, ids: torch.Tensor, extra: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """ids (2, B, L) from `prompt_rows` (+ extra (B, L, H): its vectors, zeros
        elsewhere) -> prompt rows (B, L, H): the projected text embedding plus the codec
        embedding, each where its id is >= 0, plus the extra vector (the official
        `generate` adds exactly these per row; absent ones are exact zeros here)."""
        talker = self.model.talker
        text, codec = ids[0], ids[1]
        t = talker.text_embed(text.clamp(min=0)) * (text >= 0).unsqueeze(-1).to(self.dtype)
        c = talker.codec_embed(codec.clamp(min=0)) * (codec >= 0).unsqueeze(-1).to(self.dtype)
        return t + c if extra is None else t + c + extra

    def extra_rows(self, rows: list[PromptRows], length: int,
                   out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The prompts' extra vectors as (B, length, H), zeros elsewhere (into `out` when
        given); None when no prompt has any (and no `out`)."""
        if out is None:
            if not any(r.extra for r in rows):
                return None
            out = torch.zeros(len(rows), length, self.cfg.talker.hidden_size,
                              dtype=self.dtype, device=self.device)
        else:
            out.zero_()
        for i, r in enumerate(rows):
            for start, vecs in r.extra:
                out[i, start:start + len(vecs)] = vecs
        return out

    def prefill_rows(self, slots: torch.Tensor, ids: torch.Tensor, last: torch.Tensor,
                     extra: torch.Tensor | None = None) -> None:
        """Prompts (2, B, L) (+ extra vectors (B, L, H)) into slots (B,), each row's
        prompt ending at row last (B,): samples codebook 0 of frame 0 and sets the slots'
        talker state. Rows past `last` are padding: they write cache positions the first
        decode steps overwrite before any query can read them. Pure tensor work
        (graph-capturable)."""
        s = self.state
        b, length = ids.shape[1:]
        s.seen.index_fill_(0, slots, False)
        s.n_generated.index_fill_(0, slots, 0)
        positions = self._arange[:length][None].expand(b, -1)
        talker = self.model.talker
        hidden = talker(self.embed_prompts(ids, extra), slots, positions, length)
        hidden = hidden[self._arange[:b], last]  # each prompt's last row
        token = self._sample_talker(slots, s.n_generated[slots], talker.logits(hidden))
        s.seen.index_put_((slots, token), self._true)
        s.last_token.index_copy_(0, slots, token)
        s.past_hidden.index_copy_(0, slots, hidden)
        s.position.index_copy_(0, slots, last + 1)
        s.n_generated.index_fill_(0, slots, 1)
        self.reset_scratch()

    def prompt_error(self, req: PrefillRequest) -> str | None:
        """Why this prompt cannot run (its rows plus one frame must fit the KV cache), or
        None."""
        rows = len(prompt_rows(self.cfg, req).text)
        if rows + 1 < self.max_seq_len:
            return None
        return (f"the prompt ({rows} rows: text, instruction, reference) does not fit "
                f"max_seq_len {self.max_seq_len}")

    @torch.no_grad()
    def prefill(self, reqs: list[tuple[PrefillRequest, SamplingParams, int]]) -> list[int]:
        """Prompts (request, sampling, noise seed) into their slots. Prompts run as one
        batch per length (on CUDA: per length bucket, a captured graph where one exists);
        an in-context clone's speech decoder state then takes its reference codes.
        -> the prompt lengths."""
        rows = [prompt_rows(self.cfg, req) for req, _, _ in reqs]
        lengths = [len(r.text) for r in rows]
        for req, _, _ in reqs:
            if (error := self.prompt_error(req)) is not None:
                raise ValueError(error)
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            key = self.prefill_graphs.length_bucket(n) if self.prefill_graphs else None
            groups.setdefault(key or n, []).append(i)
        for length, group in sorted(groups.items()):
            slots = [reqs[i][0].slot for i in group]
            slots_t = torch.tensor(slots, device=self.device)
            self._set_sampling(slots_t, [reqs[i] for i in group])
            padded = [PromptRows(r.text + [-1] * (length - len(r.text)),
                                 r.codec + [-1] * (length - len(r.codec)), r.extra)
                      for r in (rows[i] for i in group)]
            last = [lengths[i] - 1 for i in group]
            if self.prefill_graphs is None or not self.prefill_graphs.run(slots, padded, last):
                ids = torch.tensor([(r.text, r.codec) for r in padded], device=self.device)
                self.prefill_rows(slots_t, ids.transpose(0, 1),
                                  torch.tensor(last, device=self.device),
                                  self.extra_rows(padded, length))
            self._reset_decoder(slots_t, [(req.slot, req.icl) for req in
                                          (reqs[i][0] for i in group) if req.icl is not None])
            for slot, n in zip(slots, (lengths[i] for i in group), strict=True):
                self._positions[slot] = n
        return lengths

    def _reset_decoder(self, slots: torch.Tensor,
                       primes: list[tuple[int, IclPrompt]]) -> None:
        """Fresh speech-decoder state for these slots; an in-context clone's slot then
        takes the state after its reference codes (`_prime_decoder`)."""
        if self.graphs is not None:  # on the decoder's stream, after its steps in flight
            self.graphs.reset_decoder(slots, lambda: self._prime_decoder(primes))
        else:
            self.decoder_slots.reset(slots)
            self._prime_decoder(primes)

    def _prime_decoder(self, primes: list[tuple[int, IclPrompt]]) -> None:
        """The decoder state after a voice's reference codes, so that its audio continues
        the reference as the official decode of cat(reference codes, codes) does: decoded
        once per voice (output dropped; ~15 ms of launches for a 10 s reference on an
        H100), then copied in."""
        pool = self.decoder_slots
        for slot, icl in primes:
            idx = torch.tensor([slot], device=self.device)
            if icl.decoder_state:
                pool.load(idx, icl.decoder_state)
            else:
                self.model.speech_decoder(icl.ref_codes.T[None], pool.rows(idx))
                icl.decoder_state.extend(pool.save(slot))

    def _set_sampling(self, slots: torch.Tensor,
                      reqs: list[tuple[PrefillRequest, SamplingParams, int]]) -> None:
        s = self.state
        params = [p for _, p, _ in reqs]
        s.talker.set_rows(slots, [(p.do_sample, p.temperature, p.top_k, p.top_p)
                                  for p in params])
        s.cp.set_rows(slots, [(p.subtalker_do_sample, p.subtalker_temperature,
                               p.subtalker_top_k, p.subtalker_top_p) for p in params])
        s.penalty[slots] = torch.tensor([p.repetition_penalty for p in params],
                                        device=self.device)
        s.seed[slots] = torch.tensor([seed & 0xFFFFFFFF for _, _, seed in reqs],
                                     device=self.device)

    @torch.no_grad()
    def launch(self, slots: list[int], text_ids: list[int], talk: list[bool]) -> Step:
        """One decode step for the sessions in `slots` (continuous batching: any subset,
        any order), each fed its next text-track id; rows with `talk` False take their
        first step (frame 0, made by their prompt: no talker). A step of first steps only
        (a prompt that arrived alone) skips the talker: it would change nothing of theirs
        and costs ~a fifth of a small step, all of it in the first frame's time."""
        t0 = time.perf_counter()
        b = self.graphs.bucket(len(slots)) if self.graphs is not None else None
        step = (Step(*self.graphs.launch(slots, text_ids, talk), pipelined=True)
                if b is not None else self._eager(slots, text_ids, talk))
        step.launched_at = t0
        for slot, yes in zip(slots, talk, strict=True):
            self._positions[slot] += yes
        return step

    def _eager(self, slots: list[int], text_ids: list[int], talk: list[bool]) -> Step:
        if self.graphs is not None:  # decoder state: after the graphed steps in flight
            self.graphs.join()
        n = len(slots)
        kv_len = max(self._positions[s] for s in slots) + 1
        if self.eager_buckets is not None:
            pad = fit(self.eager_buckets, n) - n
            slots = slots + [self.scratch_slot] * pad
            text_ids = text_ids + [self.cfg.tts_pad_token_id] * pad
            talk = talk + [True] * pad
        idx = torch.tensor([slots, text_ids, talk], dtype=torch.long, device=self.device)
        self._check_step(slots, text_ids, idx[0])
        marks = [time.perf_counter()]
        token = (self.step_talker(idx[0], idx[1], idx[2], kv_len) if any(talk[:n])
                 else self.state.last_token[idx[0]])
        marks.append(time.perf_counter())
        frame, decode = self.step_cp(idx[0])
        marks.append(time.perf_counter())
        pcm = self.step_decoder(decode, frame)
        marks.append(time.perf_counter())
        timing = {name: (b - a) * 1e3 for name, (a, b) in zip(PARTS, pairwise(marks),
                                                               strict=True)}
        tokens = token[:n].tolist()
        out = frame[:n].cpu().numpy(), pcm[:n].cpu().numpy(), timing
        return Step(lambda: tokens, lambda: out, pipelined=self._eager_pipelined)

    def _check_step(self, slots: list[int], text_ids: list[int], idx: torch.Tensor) -> None:
        """Every index a decode step will use, checked on the host (the eager path is the
        reference; the graphed kernels index without bounds checks)."""
        s, t = self.state, self.cfg
        bad = [x for x in slots if not 0 <= x <= self.scratch_slot]
        if bad:
            raise IndexError(f"slots {bad} outside 0..{self.scratch_slot}")
        bad = [x for x in text_ids if not 0 <= x < t.talker.text_vocab_size]
        if bad:
            raise IndexError(f"text ids {bad} outside the text vocabulary")
        pos = s.position[idx].tolist()
        if max(pos) >= self.max_seq_len or min(pos) < 0:
            raise IndexError(f"positions {pos} of slots {slots} outside the KV cache "
                             f"(max_seq_len {self.max_seq_len})")
