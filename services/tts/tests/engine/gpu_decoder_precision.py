"""Manual GPU check (not collected by pytest): streamed vs whole decode of the speech
decoder at the released shape, per dtype and TF32 setting.

    PYTHONPATH=services/tts/src python3 services/tts/tests/engine/gpu_decoder_precision.py
"""

from __future__ import annotations

import json

import torch
from voice_tts.engine.checkpoint import random_model
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.model import DecoderState


def measure(dec, codes) -> dict:
    with torch.no_grad():
        whole = dec(codes)[0].float()
        st, parts, i, n = DecoderState(), [], 0, 1
        while i < codes.shape[-1]:
            parts.append(dec(codes[..., i:i + n], st)[0].float())
            i, n = i + n, 4
        err = torch.cat(parts) - whole
    return {"max_abs": float(err.abs().max()),
            "snr_db": float(10 * torch.log10(whole.pow(2).sum() / err.pow(2).sum().clamp(1e-30)))}


def main() -> None:
    cfg = ModelConfig.from_name("0.6b")
    dec = random_model(cfg, 0).speech_decoder
    codes = torch.randint(0, 2048, (1, 16, 100), generator=torch.Generator().manual_seed(0))
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            d = dec.to(device="cuda", dtype=dtype)
            out[f"{str(dtype)[6:]}_tf32={tf32}"] = measure(d, codes.cuda())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
