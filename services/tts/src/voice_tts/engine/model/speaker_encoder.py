"""The Base model's speaker encoder: ECAPA-TDNN, log-mel (B, T, 128) -> x-vector (B, enc_dim).

Attribute names are the official `Qwen3TTSSpeakerEncoder`'s, so the checkpoint's
`speaker_encoder.*` weights load by prefix. Layout: `blocks.0` a TDNN (conv + ReLU),
`blocks.1..n-2` SE-Res2Net blocks, `mfa` a TDNN over the concatenated block outputs,
`asp` attentive statistics pooling (weighted mean and std over time), `fc` a 1x1 conv to
`enc_dim`. Every conv pads "same" with *reflect* padding, as the official ones do (zeros
would change every frame near the edges). The x-vector goes into the talker's prompt raw,
so `enc_dim` equals the talker's hidden size.

Voice creation is off the hot path: `x_vector` runs eager, in float32, once per voice.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..audio_features import mel_spectrogram
from ..config import ModelConfig, SpeakerEncoderConfig
from .speech_decoder import _precision


class WithSpeakerEncoder(Protocol):
    """What `x_vector` reads of `Qwen3TTS` (which imports this module)."""

    cfg: ModelConfig
    speaker_encoder: SpeakerEncoder | None


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same",
                     padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channels split in `scale` chunks: chunk 0 passes, chunk i > 0 goes through its own
    TDNN after adding the previous chunk's output (a growing receptive field)."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TimeDelayNetBlock(channels // scale, channels // scale,
                                                      kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 1:
                part = self.blocks[0](part)
            elif i > 1:
                part = self.blocks[i - 1](part + outs[-1])
            outs.append(part)
        return torch.cat(outs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SqueezeExcitationRes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int,
                 dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TimeDelayNetBlock(cout, cout, 1, 1)
        self.se_block = SqueezeExcitationBlock(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _mean_std(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The official statistics, eps included (std clamped at 1e-12 before the sqrt).
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    """Attention over time from [x, global mean, global std], then the weighted mean and
    std of x: (B, C, T) -> (B, 2C, 1)."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        # Uniform weights 1/T, computed as the official (mask / mask.sum) for equal rounding.
        ones = torch.ones(x.shape[0], 1, length, dtype=x.dtype, device=x.device)
        mean, std = _mean_std(x, ones / ones.sum(dim=2, keepdim=True))
        stats = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, length),
                           std.unsqueeze(2).expand(-1, -1, length)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(stats))), dim=2)
        mean, std = _mean_std(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        if not len(ch) == len(ks) == len(dil):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        if ch[-1] != sum(ch[1:-1]):  # mfa's input is the concatenated SE-Res2Net outputs
            raise ValueError(f"enc_channels[-1] must equal sum(enc_channels[1:-1]), got {ch}")
        self.cfg = cfg
        self.blocks = nn.ModuleList([TimeDelayNetBlock(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SqueezeExcitationRes2NetBlock(
                ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.mfa = TimeDelayNetBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)

    @property
    def min_frames(self) -> int:
        """Shortest mel input the reflect padding accepts (pad < length)."""
        c = self.cfg
        pads = (d * (k - 1) // 2 for k, d in zip(c.enc_kernel_sizes, c.enc_dilations, strict=True))
        return max(pads) + 1

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


@torch.inference_mode()
def x_vector(model: WithSpeakerEncoder, wav24k: np.ndarray) -> np.ndarray:
    """Mono float32 audio at 24 kHz -> the speaker's x-vector (enc_dim,) float32.

    As the official `extract_speaker_embedding`: mel on the CPU, encoder on the model's
    device, but in float32 whatever the talker's dtype (the caller casts where it is used).
    """
    encoder = model.speaker_encoder
    if encoder is None:
        raise ValueError(f"a {model.cfg.tts_model_type} model has no speaker encoder "
                         "(voice cloning needs a Base checkpoint)")
    wav = np.asarray(wav24k, dtype=np.float32).reshape(-1)
    mel = mel_spectrogram(torch.from_numpy(wav)) if len(wav) > 384 else None
    if mel is None or mel.shape[1] < encoder.min_frames:
        raise ValueError(f"reference audio too short: {len(wav)} samples at 24 kHz")
    weight = next(encoder.parameters())  # float32: `checkpoint.prepare` keeps it so
    # Plain float32 on CUDA too: cuDNN's default TF32 convs move the x-vector by ~3e-4
    # (relative, H100), plain float32 by ~2e-6.
    with _precision(weight.device, tf32=False):
        out = encoder(mel.to(device=weight.device, dtype=weight.dtype))[0]
    return out.float().cpu().numpy()
