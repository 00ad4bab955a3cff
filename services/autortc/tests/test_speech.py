"""User speech from espeak-ng: real speech with a correct end-of-speech mark."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from voice_autortc.audio import write_wav
from voice_autortc.audio_metrics import envelope_db
from voice_autortc.cases import Input
from voice_autortc.speech import USER_RATE, make_barge_in, make_clip


def test_espeak_clip_marks_end_of_speech() -> None:
    clip = make_clip(Input(text="Hello there.", lead_silence_ms=300, tail_silence_ms=1000))
    assert clip.speech_start_s == pytest.approx(0.3)
    # Silent lead and tail, speech between; the tail is exactly the configured silence.
    assert clip.duration_s - clip.end_of_speech_s == pytest.approx(1.0, abs=0.011)
    env = envelope_db(clip.audio, USER_RATE)
    end = int(clip.end_of_speech_s * 100)
    assert env[end - 5 : end].max() > -45 and env[end + 1 :].max() < -80
    assert np.max(np.abs(clip.audio)) == pytest.approx(10 ** (-6 / 20), rel=0.01)


def test_ssml_pause_and_noise_and_gain() -> None:
    plain = make_clip(Input(text="I want to book a table."))
    paused = make_clip(Input(text='I want to <break time="600ms"/> book a table.'))
    assert paused.end_of_speech_s - plain.end_of_speech_s > 0.4
    quiet = make_clip(Input(text="Hello.", gain_db=-26))
    assert np.max(np.abs(quiet.audio)) == pytest.approx(10 ** (-26 / 20), rel=0.01)
    noisy = make_clip(Input(text="Hello.", noise_snr_db=20), seed="x")
    lead = noisy.audio[: int(0.25 * USER_RATE)]
    assert 0 < np.sqrt(np.mean(lead**2)) < 0.05  # noise under the silence, not speech level
    assert np.array_equal(noisy.audio, make_clip(Input(text="Hello.", noise_snr_db=20),
                                                 seed="x").audio)


def test_supplied_wav_is_resampled(tmp_path: Path) -> None:
    t = np.arange(22050) / 22050
    write_wav(tmp_path / "u.wav", 0.5 * np.sin(2 * np.pi * 300 * t), 22050)
    clip = make_clip(Input(wav="u.wav", tail_silence_ms=500), base_dir=tmp_path)
    assert clip.end_of_speech_s == pytest.approx(0.3 + 1.0, abs=0.02)


def test_silent_wav_is_rejected(tmp_path: Path) -> None:
    write_wav(tmp_path / "s.wav", np.zeros(16000), 16000)
    with pytest.raises(ValueError, match="no audible speech"):
        make_clip(Input(wav="s.wav"), base_dir=tmp_path)


def test_barge_in_clip_has_no_lead() -> None:
    clip = make_barge_in("Stop.")
    assert clip.speech_start_s == 0.0
