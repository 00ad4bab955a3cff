"""Run the OFFICIAL 12 Hz speech tokenizer's encoder on a checkpoint and dump codes + latents.

Runs under the oracle interpreter (see oracle_run.py). Usage:

    python oracle_speech_encoder.py spec.json out.npz

spec.json: {"checkpoint": dir, "cases": [{"name", "wav": .npy path, "sr"}]}. The speech
tokenizer is loaded the way the official wrapper loads it (`Qwen3TTSTokenizer.from_pretrained`
on speech_tokenizer/: our preprocessor_config.json, `restore_mimi_full_attention`), then the
checkpoint's weights are loaded again with strict name checking. Per case, out.npz holds:
codes_<name> = `Qwen3TTSTokenizer.encode(wav, sr)` (resampling with librosa when sr is not
24 kHz), model_codes_<name> = `model.encode` on the 24 kHz input, latents_<name> = the
encoder's pre-quantization latents (SEANet, transformer, downsample), and the package version.
"""

import os
import sys

from oracle_env import install_stubs, load_weights, read_json

install_stubs()

from importlib.metadata import version  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Config,
)
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer  # noqa: E402


def main() -> None:
    spec = read_json(sys.argv[1])
    st_dir = os.path.join(spec["checkpoint"], "speech_tokenizer")
    # transformers 5 moves `rope_theta` into `rope_parameters`, but the fork's default-RoPE
    # init reads `config.rope_theta`: set it on the parsed config, then load as the wrapper.
    cfg = Qwen3TTSTokenizerV2Config.from_pretrained(st_dir)
    cfg.encoder_config.rope_theta = cfg.encoder_config.rope_parameters["rope_theta"]
    tok = Qwen3TTSTokenizer.from_pretrained(st_dir, config=cfg, dtype=torch.float32)
    model = tok.model.eval()
    model.load_state_dict(load_weights(st_dir), strict=True)
    enc = model.encoder
    out = {"version": np.array(version("qwen-tts-hf")),
           "sliding_window": np.array(enc.config.sliding_window),
           "feature_sr": np.array(tok.feature_extractor.sampling_rate)}
    for case in spec["cases"]:
        name, wav, sr = case["name"], np.load(case["wav"]), int(case["sr"])
        codes = tok.encode(wav, sr=sr).audio_codes[0]
        out[f"codes_{name}"] = np.asarray(codes.cpu(), dtype=np.int64)
        if sr != 24000:
            continue
        x = torch.from_numpy(wav.astype(np.float32))[None]
        with torch.inference_mode():
            (model_codes,) = model.encode(x, torch.ones_like(x, dtype=torch.long),
                                          return_dict=False)
            h = enc.encoder(x[:, None])
            h = enc.encoder_transformer(h.transpose(1, 2), return_dict=True).last_hidden_state
            latents = enc.downsample(h.transpose(1, 2))
        out[f"model_codes_{name}"] = np.asarray(model_codes[0], dtype=np.int64)
        out[f"latents_{name}"] = latents[0].numpy()
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
