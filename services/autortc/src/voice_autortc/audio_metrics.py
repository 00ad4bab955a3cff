"""Ring0 (transport) and Ring1 (quality) metrics of one reply, on plain arrays.

Inputs: the post-RTC reply (what the probe recorded, sliced at reply_start/reply_end),
the frames' arrival times at the probe, and the pre-RTC reply (what the agent's TTS
produced before the transport), each mono float at its own rate.

Design notes (seed 003, section 11.4 pitfalls):
- Gaps and dropouts come from the audio's energy in 10 ms windows, not from frame
  timestamps: probe-side jitter is not a dropout. Inter-arrival is measured apart.
- A dropout is a silent run in post where pre, aligned, was audible: the TTS's own
  pauses are not the transport's fault. Without pre, only digital-silence runs count.
- Pre and post are compared in the log-mel domain (bands up to 8 kHz, STFT at each
  signal's native rate, power per Hz) on their audible frames only: a codec's delay or
  a gap the transport inserted (Ring0's business) does not misalign what follows, and
  a 48 kHz probe recording compares with a 24 kHz TTS output.
- Spikes (boom): a 5 ms window louder than anything pre-RTC produced in the reply.
This module knows nothing about cases, gates or transports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .audio import rms

HOP_MS = 10
SILENCE_DBFS = -50.0  # below this a 10 ms window counts as silent
CLIP_LEVEL = 0.999  # |x| at or above this is a clipped sample (int16 full scale)
MEL_BANDS = 40
MEL_FMAX = 8000.0  # compare up to 8 kHz: every transport we meet carries it (Opus 48k)
HF_BAND = (4000.0, 8000.0)  # seed: "hf_ratio_drop (4-8 kHz)"


@dataclass(frozen=True)
class MetricConfig:
    silence_dbfs: float = SILENCE_DBFS
    dropout_min_ms: int = 40  # a silent run at least this long can be a dropout
    valid_rms: float = 0.01  # seed 003 13.3: audible if rms >= 0.01
    spike_min_peak: float = 0.3
    spike_ratio_db: float = 18.0


def _windows(x: np.ndarray, rate: int, ms: int) -> np.ndarray:
    n = max(1, rate * ms // 1000)
    usable = len(x) // n * n
    return x[:usable].reshape(-1, n) if usable else np.zeros((0, n), dtype=np.float32)


def envelope_db(x: np.ndarray, rate: int, ms: int = HOP_MS) -> np.ndarray:
    w = _windows(x, rate, ms)
    return 20.0 * np.log10(np.maximum(np.sqrt(np.mean(np.square(w), axis=1)), 1e-9))


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    out: list[tuple[int, int]] = []
    start = None
    for i, v in enumerate(mask):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i - start))
            start = None
    if start is not None:
        out.append((start, len(mask) - start))
    return out


def audible_span(x: np.ndarray, rate: int, silence_dbfs: float = SILENCE_DBFS) -> tuple[int, int]:
    """(first, last+1) audible 10 ms window; (0, 0) if all silent."""
    idx = np.flatnonzero(envelope_db(x, rate) >= silence_dbfs)
    return (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)


def align_lag_ms(pre: np.ndarray, pre_rate: int, post: np.ndarray, post_rate: int,
                 max_lag_ms: int = 500) -> int:
    """Delay of post relative to pre, by cross-correlating 10 ms energy envelopes."""
    a, b = envelope_db(pre, pre_rate), envelope_db(post, post_rate)
    if len(a) == 0 or len(b) == 0:
        return 0
    a = np.maximum(a, SILENCE_DBFS - 10) - (SILENCE_DBFS - 10)
    b = np.maximum(b, SILENCE_DBFS - 10) - (SILENCE_DBFS - 10)
    best, best_lag = -1.0, 0
    max_lag = max_lag_ms // HOP_MS
    for lag in range(-max_lag, max_lag + 1):
        if lag >= 0:
            n = min(len(a), len(b) - lag)
            score = float(np.dot(a[:n], b[lag : lag + n])) if n > 0 else 0.0
        else:
            n = min(len(a) + lag, len(b))
            score = float(np.dot(a[-lag : -lag + n], b[:n])) if n > 0 else 0.0
        if score > best:
            best, best_lag = score, lag
    return best_lag * HOP_MS


def ring0(post: np.ndarray, rate: int, *, arrivals: list[float] | None = None,
          pre: np.ndarray | None = None, pre_rate: int | None = None,
          full_rms: float | None = None, cfg: MetricConfig | None = None) -> dict[str, float]:
    """Transport integrity of the post-RTC reply."""
    cfg = cfg or MetricConfig()
    env = envelope_db(post, rate)
    first, last = audible_span(post, rate, cfg.silence_dbfs)
    inner = env[first:last]
    silent = inner < cfg.silence_dbfs
    runs = _runs(silent)
    max_gap_ms = max((n for _, n in runs), default=0) * HOP_MS

    # Dropouts: silent runs where pre (aligned) was audible, or digital zeros without pre.
    min_run = max(1, cfg.dropout_min_ms // HOP_MS)
    dropouts = 0
    pre_env = None
    lag = 0
    if pre is not None and pre_rate:
        pre_env = envelope_db(pre, pre_rate)
        lag = align_lag_ms(pre, pre_rate, post, rate) // HOP_MS
    win = _windows(post, rate, HOP_MS)
    for s, n in runs:
        if n < min_run:
            continue
        a, b = first + s, first + s + n
        if pre_env is not None:
            pa, pb = max(0, a - lag), max(0, b - lag)
            seg = pre_env[pa:pb]
            # The pre had speech for most of this run: the transport lost it.
            if len(seg) and float(np.mean(seg >= cfg.silence_dbfs)) >= 0.5:
                dropouts += 1
        elif len(win[a:b]) and float(np.max(np.abs(win[a:b]))) == 0.0:
            dropouts += 1

    reply = post[first * (rate * HOP_MS // 1000) : last * (rate * HOP_MS // 1000)]
    clipping = float(np.mean(np.abs(reply) >= CLIP_LEVEL)) if len(reply) else 0.0
    inter = np.diff(np.asarray(arrivals, dtype=np.float64)) * 1000.0 if arrivals else np.zeros(0)
    post_rms = rms(reply)
    return {
        "post_rms": round(post_rms, 5),
        "full_rms": round(full_rms if full_rms is not None else post_rms, 5),
        "reply_ms": round(len(post) * 1000.0 / rate, 1),
        "audible_ms": float((last - first) * HOP_MS),
        "max_gap_ms": float(max_gap_ms),
        "audible_dropouts": float(dropouts),
        "clipping_ratio": round(clipping, 6),
        "spikes": float(count_spikes(post, rate, pre, pre_rate, cfg)),
        "inter_arrival_p50_ms": round(float(np.percentile(inter, 50)), 2) if len(inter) else -1.0,
        "inter_arrival_p95_ms": round(float(np.percentile(inter, 95)), 2) if len(inter) else -1.0,
        "inter_arrival_max_ms": round(float(np.max(inter)), 2) if len(inter) else -1.0,
        "frames": float(len(arrivals or [])),
    }


def count_spikes(post: np.ndarray, rate: int, pre: np.ndarray | None = None,
                 pre_rate: int | None = None, cfg: MetricConfig | None = None) -> int:
    """Clicks/booms: 5 ms windows louder than pre-RTC ever was (or, without pre, far
    louder than their 250 ms neighbourhood)."""
    cfg = cfg or MetricConfig()
    w = _windows(post, rate, 5)
    if len(w) == 0:
        return 0
    peak = np.max(np.abs(w), axis=1)
    level = np.sqrt(np.mean(np.square(w), axis=1))
    k = 25  # +-125 ms of 5 ms windows
    ratio = 10 ** (cfg.spike_ratio_db / 20)
    pre_max = None
    if pre is not None and pre_rate and len(pre):
        # Louder than anything the TTS produced in this reply: the transport added it.
        # (Global, not aligned: a transport gap shifts alignment, a peak stays a peak.)
        pre_max = float(np.max(np.abs(pre)))
    spikes, i = 0, 0
    while i < len(w):
        if peak[i] >= cfg.spike_min_peak:
            if pre_max is not None:
                is_spike = peak[i] >= 1.25 * max(pre_max, 1e-4) or (
                    peak[i] >= CLIP_LEVEL > pre_max)  # full scale, never reached by pre
            else:
                around = np.concatenate([level[max(0, i - k) : max(0, i - 1)],
                                         level[i + 2 : i + k]])
                ctx = float(np.median(around)) if len(around) else 0.0
                is_spike = peak[i] >= ratio * max(ctx, 1e-4)
            if is_spike:
                spikes += 1
                i += 3  # one click spans a few windows: count it once
                continue
        i += 1
    return spikes


# --- Ring1: pre-RTC vs post-RTC -----------------------------------------------------------

def _mel_filterbank(rate: int, n_fft: int, bands: int = MEL_BANDS,
                    fmax: float = MEL_FMAX) -> np.ndarray:
    def mel(f: np.ndarray | float) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    fmax = min(fmax, rate / 2)
    edges = hz(np.linspace(mel(0.0), mel(fmax), bands + 2))
    freqs = np.fft.rfftfreq(n_fft, 1.0 / rate)
    fb = np.zeros((bands, len(freqs)), dtype=np.float64)
    for b in range(bands):
        lo, mid, hi = edges[b], edges[b + 1], edges[b + 2]
        up = (freqs - lo) / max(mid - lo, 1e-9)
        down = (hi - freqs) / max(hi - mid, 1e-9)
        fb[b] = np.maximum(0.0, np.minimum(up, down))
    return fb


def _power_spec(x: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """|STFT|^2 with 25 ms Hann windows every 10 ms, and the bin frequencies."""
    win_n, hop = rate * 25 // 1000, rate * HOP_MS // 1000
    n_fft = 1 << (win_n - 1).bit_length()
    if len(x) < win_n:
        x = np.concatenate([x, np.zeros(win_n - len(x), dtype=np.float32)])
    n = 1 + (len(x) - win_n) // hop
    idx = np.arange(win_n)[None, :] + hop * np.arange(n)[:, None]
    w = np.hanning(win_n)
    spec = np.abs(np.fft.rfft(x[idx] * w, n=n_fft, axis=1)) ** 2
    # Power density (per Hz): the same sound at 24 and 48 kHz gives the same values.
    spec /= float(np.sum(w**2)) * rate
    return spec, np.fft.rfftfreq(n_fft, 1.0 / rate)


def log_mel(x: np.ndarray, rate: int) -> np.ndarray:
    spec, _ = _power_spec(x, rate)
    n_fft = (spec.shape[1] - 1) * 2
    return 10.0 * np.log10(np.maximum(spec @ _mel_filterbank(rate, n_fft).T, 1e-16))


def hf_ratio(x: np.ndarray, rate: int) -> float:
    """Energy share of 4-8 kHz within 0-8 kHz."""
    spec, freqs = _power_spec(x, rate)
    total = float(spec[:, freqs <= MEL_FMAX].sum())
    hf = float(spec[:, (freqs >= HF_BAND[0]) & (freqs <= HF_BAND[1])].sum())
    return hf / total if total > 0 else 0.0


def _frame_dbfs(x: np.ndarray, rate: int) -> np.ndarray:
    """Level of each STFT frame (25 ms every 10 ms), aligned with log_mel's frames."""
    win_n, hop = rate * 25 // 1000, rate * HOP_MS // 1000
    if len(x) < win_n:
        x = np.concatenate([x, np.zeros(win_n - len(x), dtype=np.float32)])
    n = 1 + (len(x) - win_n) // hop
    idx = np.arange(win_n)[None, :] + hop * np.arange(n)[:, None]
    return 10.0 * np.log10(np.maximum(np.mean(np.square(x[idx]), axis=1), 1e-18))


def _chunk_distance(a: np.ndarray, b: np.ndarray, chunk: int = 10, max_lag: int = 5) -> float:
    """Mean |a - b| (dB) of 100 ms chunk averages of two log-mel sequences, at the best
    lag within +-50 ms: a frame of slack at each silence edge or a codec's sub-frame delay
    must not read as a different sound (frame-level noise does not match frame by frame).
    """
    best = None
    for lag in range(-max_lag, max_lag + 1):
        x, y = (a, b[lag:]) if lag >= 0 else (a[-lag:], b)
        n = min(len(x), len(y)) // chunk * chunk
        if n == 0:
            continue
        cx = x[:n].reshape(-1, chunk, x.shape[1]).mean(axis=1)
        cy = y[:n].reshape(-1, chunk, y.shape[1]).mean(axis=1)
        d = float(np.mean(np.abs(cx - cy)))
        best = d if best is None else min(best, d)
    if best is None:  # under 100 ms of audio: compare what there is
        n = min(len(a), len(b))
        best = float(np.mean(np.abs(a[:n] - b[:n]))) if n else 0.0
    return best


def ring1(pre: np.ndarray, pre_rate: int, post: np.ndarray, post_rate: int,
          cfg: MetricConfig | None = None) -> dict[str, float]:
    """Quality: mel distance and HF ratio drop of post vs pre, and the rate drift.

    Both sides are compared on their audible frames only (silences dropped), so a gap
    the transport inserted (Ring0's business) does not shift every later frame out of
    alignment; what is left differs only if the sound itself changed. The drift is the
    ratio of audible frames: a gap delays audio (no drift), a rate change or lost audio
    changes how much of it there is.
    """
    cfg = cfg or MetricConfig()
    a, b = log_mel(pre, pre_rate), log_mel(post, post_rate)
    a_on = _frame_dbfs(pre, pre_rate)[: len(a)] >= cfg.silence_dbfs
    b_on = _frame_dbfs(post, post_rate)[: len(b)] >= cfg.silence_dbfs
    floor = cfg.silence_dbfs - 30.0  # bands far below audibility do not count
    a, b = np.maximum(a[a_on], floor), np.maximum(b[b_on], floor)
    mel_distance = _chunk_distance(a, b)
    hf_pre, hf_post = hf_ratio(pre, pre_rate), hf_ratio(post, post_rate)
    hf_drop_db = 10.0 * np.log10(max(hf_pre, 1e-9) / max(hf_post, 1e-9)) if hf_pre > 0 else 0.0
    # Audible time in 2 ms windows: fine enough that the edges of an inserted gap (a
    # delay, not a loss) add almost nothing; a rate change or lost audio shows fully.
    pre_on = int(np.sum(envelope_db(pre, pre_rate, 2) >= cfg.silence_dbfs))
    post_on = int(np.sum(envelope_db(post, post_rate, 2) >= cfg.silence_dbfs))
    drift = post_on / pre_on - 1.0 if pre_on else 0.0
    return {
        "mel_distance_db": round(mel_distance, 3),
        "hf_ratio_pre": round(hf_pre, 4),
        "hf_ratio_post": round(hf_post, 4),
        "hf_ratio_drop_db": round(float(hf_drop_db), 3),
        "speed_drift": round(abs(drift), 4),
        "align_lag_ms": float(align_lag_ms(pre, pre_rate, post, post_rate)),
    }
