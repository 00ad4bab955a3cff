"""The speaker encoder's input: a 128-band log-mel spectrogram of 24 kHz audio.

Exactly the official `mel_spectrogram` as `extract_speaker_embedding` calls it (n_fft 1024,
hop 256, periodic Hann window of 1024, 128 mels over 0..12 kHz, no centering). The official
code takes its filter bank from `librosa.filters.mel` (Slaney mel scale, Slaney area
normalization, float32); `slaney_mel_filters` below repeats librosa 0.11's arithmetic step
for step in numpy, so the engine needs no librosa and the matrix comes out bit-equal.

`to_24k` resamples a reference as the official code does (`librosa.resample`, whose default
is soxr "HQ", then librosa's length fix), bit for bit.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import soxr
import torch

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz >= _MIN_LOG_HZ:
        return _MIN_LOG_MEL + np.log(hz / _MIN_LOG_HZ) / _LOGSTEP
    return hz / _F_SP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = _F_SP * mels
    log_t = mels >= _MIN_LOG_MEL
    hz[log_t] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels[log_t] - _MIN_LOG_MEL))
    return hz


@cache
def slaney_mel_filters(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                       fmin: float = 0.0, fmax: float = F_MAX) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) float32 triangular filters, = librosa.filters.mel(...)."""
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fft_freqs)
    weights = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    # In place on the float32 array, as librosa does (the rounding must match).
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, np.newaxis]
    weights.flags.writeable = False  # cached: shared between callers
    return weights


def to_24k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono audio at any rate -> float32 at 24 kHz, = librosa.resample(audio, sr, 24000)."""
    y = np.asarray(audio, dtype=np.float32).reshape(-1)
    if sample_rate == SAMPLE_RATE:
        return y
    # librosa trims or zero-pads soxr's output to ceil(N * ratio) samples.
    n = int(np.ceil(len(y) * (float(SAMPLE_RATE) / sample_rate)))
    out = soxr.resample(y, sample_rate, SAMPLE_RATE, quality="HQ")[:n]
    return np.pad(out, (0, n - len(out))).astype(np.float32, copy=False)


def mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """(N,) or (1, N) float32 audio at 24 kHz -> (1, T, 128) log-mel, T = (N - 256) // 256 + 1."""
    y = wav.reshape(1, -1).float()
    basis = torch.from_numpy(slaney_mel_filters().copy()).to(y.device)
    window = torch.hann_window(N_FFT, device=y.device)
    pad = (N_FFT - HOP) // 2
    y = torch.nn.functional.pad(y.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(basis, mag)
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)
