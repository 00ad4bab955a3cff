"""Run the OFFICIAL speaker-encoder path (mel, x-vector) on a Base checkpoint directory.

Runs under the oracle interpreter (see oracle_run.py). Usage:

    python oracle_speaker.py spec.json out.npz

spec.json: {"checkpoint": dir, "inputs": path of an .npz with wav_<name> (float32 mono)
and sr_<name>}. For each name, out.npz holds wav24k_<name> (the reference at 24 kHz:
`librosa.resample` as `create_voice_clone_prompt` does, W 440-444), mel_<name> (the
official `mel_spectrogram` with `extract_speaker_embedding`'s arguments, (1, T, 128)) and
xvec_<name> (`extract_speaker_embedding`, float32). The model is built from config.json
and loaded with strict name checking, so our writer's `speaker_encoder.*` names are checked.
"""

import os
import sys

from oracle_env import install_stubs, load_weights, read_json

install_stubs()

import librosa  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import (  # noqa: E402
    Qwen3TTSForConditionalGeneration,
    mel_spectrogram,
)


def main() -> None:
    spec = read_json(sys.argv[1])
    ckpt = spec["checkpoint"]
    cfg = Qwen3TTSConfig(**read_json(os.path.join(ckpt, "config.json")))
    assert cfg.tts_model_type == "base", cfg.tts_model_type
    model = Qwen3TTSForConditionalGeneration(cfg).float().eval()
    model.load_state_dict(load_weights(ckpt), strict=True)
    target = model.speaker_encoder_sample_rate
    out = {}
    with np.load(spec["inputs"]) as data:
        names = [k[len("wav_"):] for k in data.files if k.startswith("wav_")]
        for name in names:
            wav, sr = data[f"wav_{name}"], int(data[f"sr_{name}"])
            if sr != target:  # W 441-444, verbatim
                wav = librosa.resample(y=wav.astype(np.float32), orig_sr=int(sr),
                                       target_sr=target)
            mel = mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=128,
                                  sampling_rate=24000, hop_size=256, win_size=1024, fmin=0,
                                  fmax=12000).transpose(1, 2)
            xvec = model.extract_speaker_embedding(audio=wav, sr=target)
            out[f"wav24k_{name}"] = wav
            out[f"mel_{name}"] = mel.numpy()
            out[f"xvec_{name}"] = xvec.float().numpy()
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
