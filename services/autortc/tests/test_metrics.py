"""Ring0 / Ring1 metrics on known signals: each measure moves when it should, not else."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RATE, received, speechlike
from voice_autortc.audio import resample
from voice_autortc.audio_metrics import align_lag_ms, count_spikes, ring0, ring1


def test_identical_transport_is_clean(reply: np.ndarray) -> None:
    rx = received(reply)
    m = ring0(rx.audio, RATE, arrivals=rx.arrivals, pre=reply, pre_rate=RATE)
    assert m["max_gap_ms"] == 0 and m["audible_dropouts"] == 0
    assert m["clipping_ratio"] == 0 and m["spikes"] == 0
    assert m["inter_arrival_p95_ms"] == pytest.approx(20.0)
    q = ring1(reply, RATE, rx.audio, RATE)
    assert q["mel_distance_db"] == pytest.approx(0.0, abs=1e-6)
    assert q["hf_ratio_drop_db"] == pytest.approx(0.0, abs=1e-6) and q["speed_drift"] == 0


def test_gap_is_a_dropout_only_where_pre_had_speech() -> None:
    pre = speechlike(pauses=[(1.0, 1.3)])  # the TTS itself paused 300 ms
    post = pre.copy()
    m = ring0(post, RATE, pre=pre, pre_rate=RATE)
    assert m["max_gap_ms"] == pytest.approx(300, abs=10) and m["audible_dropouts"] == 0
    post[int(2.0 * RATE) : int(2.1 * RATE)] = 0.0  # the transport lost 100 ms
    m = ring0(post, RATE, pre=pre, pre_rate=RATE)
    assert m["audible_dropouts"] == 1
    # Without pre only digital silence counts (a lost packet played as zeros).
    assert ring0(post, RATE)["audible_dropouts"] == 2


def test_gap_after_codec_delay_is_aligned() -> None:
    pre = speechlike()
    post = np.concatenate([np.zeros(int(0.06 * RATE), np.float32), pre])  # 60 ms later
    assert align_lag_ms(pre, RATE, post, RATE) == 60
    assert ring0(post, RATE, pre=pre, pre_rate=RATE)["audible_dropouts"] == 0
    assert ring1(pre, RATE, post, RATE)["mel_distance_db"] < 0.5


def test_clipping_and_inter_arrival(reply: np.ndarray) -> None:
    loud = np.clip(reply * 20, -1, 1)
    assert ring0(loud, RATE)["clipping_ratio"] > 0.1
    rx = received(reply)
    bursty = [rx.arrivals[i - i % 5 + 4] if i - i % 5 + 4 < len(rx.arrivals) else t
              for i, t in enumerate(rx.arrivals)]
    assert ring0(reply, RATE, arrivals=bursty)["inter_arrival_p95_ms"] >= 80


def test_spike_against_pre_and_alone(reply: np.ndarray) -> None:
    post = reply.copy()
    post[RATE : RATE + 100] = 1.0
    assert count_spikes(post, RATE, reply, RATE) == 1
    assert count_spikes(post, RATE) == 1
    assert count_spikes(reply, RATE, reply, RATE) == 0


def test_quality_of_a_muffled_and_a_fast_reply(reply: np.ndarray) -> None:
    spec = np.fft.rfft(reply)
    spec[np.fft.rfftfreq(len(reply), 1 / RATE) > 3000] = 0
    muffled = np.fft.irfft(spec, n=len(reply)).astype(np.float32)
    q = ring1(reply, RATE, muffled, RATE)
    assert q["hf_ratio_drop_db"] > 20 and q["mel_distance_db"] > 4
    fast = resample(reply, int(RATE * 1.1), RATE)
    assert ring1(reply, RATE, fast, RATE)["speed_drift"] == pytest.approx(0.09, abs=0.02)


def test_different_rates_compare_in_mel_domain(reply: np.ndarray) -> None:
    # A 48 kHz post (what a WebRTC probe records) of a 24 kHz pre is not a distortion.
    up = resample(reply, RATE, 48000)
    assert ring1(reply, RATE, up, 48000)["mel_distance_db"] < 1.5


def test_underrun_is_transport_not_quality() -> None:
    # The sender ran dry three times: audio delayed by 60 ms gaps, none of it lost.
    pre = speechlike(seconds=4.0, seed=9)
    cuts = [int(s * RATE) for s in (0.5, 1.7, 3.1)]
    parts, last = [], 0
    for c in cuts:
        parts += [pre[last:c], np.zeros(int(0.06 * RATE), np.float32)]
        last = c
    post = np.concatenate([*parts, pre[last:]])
    m = ring0(post, RATE, pre=pre, pre_rate=RATE)
    assert m["audible_dropouts"] == 3 and m["max_gap_ms"] == pytest.approx(60, abs=10)
    assert m["spikes"] == 0
    q = ring1(pre, RATE, post, RATE)
    assert q["mel_distance_db"] < 1.0 and q["speed_drift"] < 0.02


def test_sender_lateness_replays_the_playout_clock() -> None:
    from voice_autortc.transports.direct import _sender_lateness

    frame = bytes(960)  # 20 ms at 24 kHz, int16
    on_time = [(10.0 + i * 0.01, frame) for i in range(50)]  # delivered 2x real time
    s = _sender_lateness(on_time, play_start=10.0, rate=24000)
    assert s["sender_late_frames"] == 0 and s["sender_delivery_rtf"] == pytest.approx(0.49)
    stalled = [*on_time[:10], *[(10.5 + i * 0.01, frame) for i in range(40)]]
    s = _sender_lateness(stalled, play_start=10.0, rate=24000)
    assert s["sender_late_frames"] == 1 and s["sender_late_ms"] == pytest.approx(300, abs=1)
