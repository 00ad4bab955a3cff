"""The incremental speech decoder equals the one-shot decode of the whole utterance.

State carrying (conv tails, transposed-conv overlap, the transformer's 71-frame KV window)
makes packets exact up to float rounding: float32 CPU max abs diff <= 1e-4, SNR >= 60 dB,
for any packet schedule, including utterances longer than the 72-frame attention window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from voice_tts.engine.checkpoint import random_model
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.model import DecoderSlots, DecoderState

from .lib import snr_db


@pytest.fixture(scope="module")
def decoder():
    return random_model(ModelConfig.from_name("tiny"), seed=3).speech_decoder


@pytest.mark.parametrize("schedule", [(1, 4), (2, 4), (1, 1), (3, 7), (4,), (1, 5, 16)])
def test_packets_equal_whole(decoder, schedule):
    gen = torch.Generator().manual_seed(sum(schedule))
    codes = torch.randint(0, 2048, (1, 16, 120), generator=gen)  # 120 > 72-frame window
    with torch.no_grad():
        whole = decoder(codes)[0].numpy()
        state, out, i, k = DecoderState(), [], 0, 0
        while i < codes.shape[-1]:
            n = schedule[min(k, len(schedule) - 1)]
            out.append(decoder(codes[..., i:i + n], state)[0].numpy())
            i, k = i + n, k + 1
    streamed = np.concatenate(out)
    assert streamed.shape == whole.shape == (120 * 1920,)
    max_abs, snr = float(np.abs(streamed - whole).max()), snr_db(whole, streamed)
    print(f"\nschedule={schedule}: max_abs={max_abs:.2e} snr={snr:.1f}dB")
    assert max_abs <= 1e-4
    assert snr >= 60
    assert np.abs(whole).max() < 1.0  # the random vocoder is not just clipping


def test_batch_rows_are_independent(decoder):
    codes = torch.randint(0, 2048, (3, 16, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        batch = decoder(codes)
        solo = torch.cat([decoder(codes[i:i + 1]) for i in range(3)])
    assert torch.allclose(batch, solo, atol=1e-5)


def test_slot_rows_batched_frame_by_frame_equal_whole(decoder):
    """The engine's way: sessions in arbitrary slots, joining at different frames, decoded
    one frame per step in one batch; a slot reused after reset starts from silence."""
    codes = torch.randint(0, 2048, (3, 16, 90), generator=torch.Generator().manual_seed(5))
    slots, start = [4, 0, 2], [0, 3, 40]  # row r joins at step start[r]
    pool = DecoderSlots(decoder, 5, torch.device("cpu"))
    pool.reset(torch.tensor([4]))  # resetting one slot leaves the others as they are
    out: list[list[torch.Tensor]] = [[], [], []]
    with torch.no_grad():
        for step in range(90):
            rows = [r for r in range(3) if start[r] <= step]
            frame = torch.stack([codes[r, :, step - start[r]] for r in rows])[..., None]
            pcm = decoder(frame, pool.rows(torch.tensor([slots[r] for r in rows])))
            for i, r in enumerate(rows):
                out[r].append(pcm[i])
        for r in range(3):
            got = torch.cat(out[r]).numpy()
            whole = decoder(codes[r:r + 1, :, :90 - start[r]])[0].numpy()
            assert got.shape == whole.shape
            assert np.abs(got - whole).max() <= 1e-4 and snr_db(whole, got) >= 60, f"row {r}"
