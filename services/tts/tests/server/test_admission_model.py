"""The capacity model and the admission rules, fed synthetic `StepStats` (no server)."""

from __future__ import annotations

import time

import grpc
import pytest
from voice_tts.engine import StepStats, UtteranceEnd
from voice_tts.server.admission.admission import (
    Admission,
    Rejected,
    TrackedSession,
    frame_budget_ms,
)
from voice_tts.server.admission.capacity import FramePeriodModel, FrontModel, bucket_of


def stats(batch: int, step_ms: float) -> StepStats:
    return StepStats(batch_size=batch, step_ms=step_ms, talker_ms=0.0,
                     code_predictor_ms=0.0, decoder_ms=0.0)


def h100_period(b: int) -> float:
    """0.6B on an H100 (bench/README.md): RTF x 80 ms, graph buckets."""
    table = {1: 3.6, 2: 4.2, 4: 4.8, 8: 5.5, 16: 6.2, 32: 7.3, 64: 9.7, 128: 15.1, 256: 24.6}
    return table[bucket_of(b)]


def feed(model: FramePeriodModel, batch: int, period_ms: float, steps: int = 30,
         t0: float = 0.0, step_ms: float | None = None) -> float:
    """`steps` back-to-back steps: stats arrive one period apart, each reporting
    `step_ms` (launch -> audio out, ~1.7 periods with CUDA graphs)."""
    t = t0
    for _ in range(steps):
        t += period_ms / 1e3
        model.observe(stats(batch, step_ms if step_ms is not None else 1.7 * period_ms), t)
    return t


def test_buckets() -> None:
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 200, 256)] == \
        [1, 2, 4, 4, 8, 8, 16, 256, 256]


def test_nothing_measured_predicts_nothing() -> None:
    m = FramePeriodModel()
    assert m.predict_ms(10) is None
    assert m.max_streams(56.0, 64) == 64


def test_back_to_back_steps_measure_the_period_not_step_ms() -> None:
    m = FramePeriodModel()
    feed(m, 256, 24.6, steps=60)  # step_ms 41.8: the audio leaves one iteration after the launch
    assert m.predict_ms(256) == pytest.approx(24.6, rel=1e-3)


def test_idle_gaps_fall_back_to_step_ms() -> None:
    m = FramePeriodModel()
    t = 0.0
    for _ in range(20):  # one step every 500 ms (waiting for text): not the period
        t += 0.5
        m.observe(stats(1, 6.0), t)
    assert m.predict_ms(1) == pytest.approx(6.0)


def test_interpolates_between_buckets_and_grows_in_proportion_above() -> None:
    m = FramePeriodModel(alpha=1.0)
    t = feed(m, 16, 6.0, steps=3)
    t = feed(m, 64, 12.0, steps=3, t0=t + 1.0)
    assert m.predict_ms(8) == pytest.approx(6.0)  # below the first point: flat
    assert m.predict_ms(40) == pytest.approx(9.0)  # halfway between (16, 6) and (64, 12)
    assert m.predict_ms(128) == pytest.approx(24.0)  # above: 12 ms x 128 / 64
    # A noisy bucket that ran faster than a smaller one does not make P fall.
    feed(m, 32, 4.0, steps=3, t0=t + 1.0)
    assert m.predict_ms(32) == pytest.approx(6.0)
    assert m.predict_ms(64) == pytest.approx(12.0)


def test_ema_follows_a_slower_machine() -> None:
    m = FramePeriodModel(alpha=0.2)
    t = feed(m, 8, 10.0)
    feed(m, 8, 20.0, steps=40, t0=t)
    assert m.predict_ms(8) == pytest.approx(20.0, rel=0.01)


def test_h100_capacity_from_measured_steps() -> None:
    """Fed the H100's measured periods at every bucket, the model admits ~256+ streams
    at margin 0.7 (56 ms) and ~150 at margin 0.2 (16 ms)."""
    m = FramePeriodModel()
    t = 0.0
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        t = feed(m, b, h100_period(b), t0=t + 1.0)
    assert m.max_streams(56.0, 1024) >= 512  # 24.6 ms x n / 256 <= 56: n <= 582
    assert 128 < m.max_streams(16.0, 1024) < 160


def admission(margin: float = 0.7, max_sessions: int = 1000,
              grace: float = 2.0) -> tuple[Admission, FramePeriodModel]:
    m = FramePeriodModel(alpha=1.0)
    return Admission(m, max_sessions, margin * 80.0, grace, 80.0), m


def test_frame_budget_keeps_an_utterances_start_real_time() -> None:
    assert frame_budget_ms(0.7, 1, 1, 80.0) == pytest.approx(56.0)  # margin x 80 ms
    assert frame_budget_ms(0.7, 1, 4, 80.0) == pytest.approx(20.0)  # 4 P <= 80 ms
    assert frame_budget_ms(0.7, 2, 4, 80.0) == pytest.approx(40.0)
    assert frame_budget_ms(0.0, 1, 4, 80.0) == 0.0  # off
    assert frame_budget_ms(0.7, 1, 4, 80.0, override_ms=35.0) == 35.0  # set outright
    assert frame_budget_ms(0.0, 1, 4, 80.0, override_ms=35.0) == 0.0  # off wins


class FakeSession:
    def __init__(self) -> None:
        self.utterance_id = 0
        self.closed = False

    def push_text(self, piece: str) -> None:
        pass

    def flush(self) -> None:
        self.utterance_id += 1

    def cancel(self) -> None:
        self.utterance_id += 1

    def reset(self, seed: int | None = None) -> None:
        self.utterance_id += 1

    def close(self) -> None:
        self.closed = True


def speak(adm: Admission, now: float) -> tuple[TrackedSession, object]:
    t = adm.admit(now)
    s = TrackedSession(FakeSession(), t)
    s.push_text("hello")
    return s, t


def test_capacity_rejects_with_a_retry_elsewhere_message() -> None:
    adm, m = admission(margin=0.7)  # budget 56 ms
    feed(m, 10, 19.0)  # 1.9 ms per stream in proportion: 29 streams fit
    admitted = []
    with pytest.raises(Rejected) as e:
        for _ in range(100):
            admitted.append(speak(adm, 0.0))
    assert len(admitted) == 29
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.reason == "capacity"
    assert "retry on another replica" in e.value.message
    assert "29 streams" in e.value.message
    assert adm.headroom() == 0
    # An utterance ends (the engine's UtteranceEnd through the wrapped sink): room for one.
    _, t = admitted[0]
    seen = []
    t.sink(seen.append)(UtteranceEnd(0, 10, "eos"))
    assert seen and adm.speaking == 28
    speak(adm, 0.0)
    with pytest.raises(Rejected):
        adm.admit(0.0)


def test_open_stream_cap_holds_with_capacity_to_spare() -> None:
    adm, _ = admission(max_sessions=3)
    for _ in range(3):
        adm.admit(0.0)
    with pytest.raises(Rejected) as e:
        adm.admit(0.0)
    assert e.value.reason == "sessions"


def test_a_burst_reserves_capacity_before_any_text() -> None:
    adm, m = admission(margin=0.7, grace=2.0)
    feed(m, 4, 7.6)  # 1.9 ms per stream: 29 fit
    for _ in range(29):
        adm.admit(0.0)  # none has sent text yet
    with pytest.raises(Rejected):
        adm.admit(0.5)
    # Past the grace, the silent ones are idle and cost nothing.
    assert adm.load(2.6) == 0
    adm.admit(2.6)
    assert adm.open == 30


def test_idle_engine_always_admits_one() -> None:
    adm, m = admission(margin=0.7)
    feed(m, 1, 500.0)  # far slower than real time (a bad first measurement)
    s, _ = speak(adm, 0.0)  # nothing else speaking: admitted
    with pytest.raises(Rejected):
        adm.admit(0.0)
    s.close()
    assert adm.speaking == 0 and adm.open == 0
    speak(adm, 0.0)


def test_stop_reset_and_close_end_speaking() -> None:
    adm, _ = admission()
    s, t = speak(adm, 0.0)
    assert adm.speaking == 1
    s.cancel()  # STOP
    assert adm.speaking == 0
    s.push_text("again")
    assert adm.speaking == 1
    s.reset(7)
    assert adm.speaking == 0
    s.push_text("and again")
    s.flush()
    s.push_text("queued")  # a second utterance behind the first
    t.sink(lambda _: None)(UtteranceEnd(2, 5, "eos"))
    assert adm.speaking == 1  # utterance 3 still to speak
    s.close()
    assert adm.speaking == 0 and adm.open == 0
    t.sink(lambda _: None)(UtteranceEnd(3, 0, "cancelled"))  # late: ignored
    assert adm.speaking == 0


def test_margin_zero_admits_by_count_only() -> None:
    adm, m = admission(margin=0.0, max_sessions=50)
    feed(m, 1, 500.0)
    for _ in range(50):
        speak(adm, 0.0)
    with pytest.raises(Rejected) as e:
        adm.admit(0.0)
    assert e.value.reason == "sessions"


class Streams:
    def __init__(self) -> None:
        self.open = 0


def test_front_model_learns_its_share_per_open_stream() -> None:
    st = Streams()
    front = FrontModel(open_streams=lambda: st.open, alpha=1.0)
    st.open = 40
    front.sample(now=0.0, cpu_s=0.0)
    assert front.share(100) is None  # nothing learned yet
    st.open = 60  # 50 open on average over the window, the loop busy 0.25 s of 1 s
    front.sample(now=1.0, cpu_s=0.25)
    assert front.per_stream == pytest.approx(0.005)
    assert front.share(100) == pytest.approx(0.5)
    front.sample(now=1.5, cpu_s=0.9)  # within the window: nothing changes
    assert front.share(100) == pytest.approx(0.5)


def test_paced_streams_are_counted_while_they_write_not_only_while_the_engine_speaks() -> None:
    """Seen on the H100 (0.6B, paced, 30 req/s): ~120 open streams, ~25 of them with
    audio still to make, the loop at ~0.2 of a core. The model that priced the engine's
    frames at the loop's CPU per message predicted over 0.7 and refused 40 % of the
    calls; per open stream, the next call is within the limit."""
    st = Streams()
    front = FrontModel(open_streams=lambda: st.open, alpha=1.0)
    adm = Admission(FramePeriodModel(), 256, 20.0, 2.0, 80.0, front, front_share=0.7)
    st.open = 120
    now = time.monotonic()  # admit() samples the front on the real clock
    front.sample(now=now - 2.0, cpu_s=0.0)
    front.sample(now=now - 1.0, cpu_s=0.2)
    assert front.share(121) == pytest.approx(0.2 / 120 * 121)
    adm.admit(0.0)


def test_front_rule_rejects_when_the_loop_would_saturate() -> None:
    m = FramePeriodModel(alpha=1.0)
    st = Streams()
    front = FrontModel(open_streams=lambda: st.open, alpha=1.0)
    adm = Admission(m, 1000, 56.0, 2.0, 80.0, front, front_share=0.7)
    feed(m, 300, 15.0)  # the engine alone would take ~1100 streams
    st.open = 100
    now = time.monotonic()  # admit() samples the front on the real clock
    front.sample(now=now - 1.0, cpu_s=0.0)
    front.sample(now=now, cpu_s=0.25)  # 100 open streams, a quarter of a core
    admitted = 0
    with pytest.raises(Rejected) as e:
        for _ in range(1000):
            adm.admit(0.0)
            admitted += 1
    assert e.value.reason == "front"
    # 2.5 ms of a core's second per stream: 0.7 at 280 open (the float product rounds
    # either side of the limit).
    assert admitted in (279, 280)
    assert "gRPC front" in e.value.message and "retry on another replica" in e.value.message


def test_a_bucket_measured_under_overload_expires_instead_of_locking_admission_out() -> None:
    """Seen on the H100 (1.7B, 30 req/s): an overload left a slow point at batch 4; with
    2-5 streams admitted afterwards that bucket never stepped again, so every prediction
    above batch 2 stayed over the budget and 93% of the calls were refused."""
    m = FramePeriodModel(alpha=1.0, stale_s=10.0)
    t = feed(m, 4, 100.0, steps=5)  # the overload
    t = feed(m, 2, 5.0, steps=100, t0=t)
    assert m.predict_ms(3) > 20.0  # still within stale_s: the slow point holds
    feed(m, 2, 5.0, steps=2500, t0=t)  # 12.5 s more of small batches
    assert m.predict_ms(3) == pytest.approx(7.5)  # extrapolated from batch 2: 5 ms x 3/2


def test_front_cost_is_forgotten_after_quiet_windows() -> None:
    st = Streams()
    front = FrontModel(open_streams=lambda: st.open, alpha=1.0)
    st.open = 10
    front.sample(now=0.0, cpu_s=0.0)
    front.sample(now=1.0, cpu_s=1.0)  # an overload: a whole core for 10 streams
    assert front.share(5) == pytest.approx(0.5)
    st.open = 2
    for t in (2.0, 3.0, 4.0):  # quiet: too few streams to measure
        front.sample(now=t, cpu_s=1.0 + t / 100)
    assert front.share(5) is None  # unknown again: admission admits and re-measures


H100_WARMUP = {b: h100_period(b) * 1.3 for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}


def test_a_seeded_model_predicts_from_the_warmup_before_any_step() -> None:
    m = FramePeriodModel()
    m.seed(H100_WARMUP)
    assert m.predict_ms(1) == pytest.approx(3.6 * 1.3)
    assert m.predict_ms(100) == pytest.approx(
        9.7 * 1.3 + (15.1 - 9.7) * 1.3 * (100 - 64) / 64)
    assert m.max_streams(20.0, 1000) == 131  # 128 at 19.6 ms, + 12.4 ms per 128 above


def test_fresh_steps_override_their_bucket_and_fall_back_to_the_seed_when_stale() -> None:
    m = FramePeriodModel(alpha=1.0, stale_s=10.0)
    m.seed(H100_WARMUP)
    t = feed(m, 4, 100.0, steps=5)  # an overload measured at batch 4
    assert m.predict_ms(4) == pytest.approx(100.0)
    assert m.predict_ms(64) == pytest.approx(100.0)  # never faster than a smaller batch
    feed(m, 1, 3.0, steps=4000, t0=t)  # 12 s of batch 1: batch 4 is stale
    assert m.predict_ms(4) == pytest.approx(4.8 * 1.3)  # the seed again, not 3 ms x 4


def test_a_server_back_from_idle_takes_a_burst_the_gpu_can_carry() -> None:
    """After an idle pause only the batch-1 point is fresh: unseeded, the model
    extrapolates in proportion and refuses a burst the GPU carries at ~8 ms a step."""
    cold, m = admission(margin=0.7)  # budget 20 ms (frame_budget_ms(0.7, 1, 4, 80.0))
    cold.budget_ms = frame_budget_ms(0.7, 1, 4, 80.0)
    feed(m, 1, 6.2)  # the last steps before the pause, at batch 1
    seeded, m2 = admission(margin=0.7)
    seeded.budget_ms = cold.budget_ms
    m2.seed(H100_WARMUP)
    feed(m2, 1, 6.2)

    def burst(adm: Admission) -> int:
        n = 0
        for _ in range(20):
            try:
                speak(adm, 0.0)
                n += 1
            except Rejected:
                pass
        return n

    assert burst(cold) == 3  # 6.2 ms x 4 / 1 > 20 ms: the fourth is refused
    assert burst(seeded) == 20


def test_front_cost_is_forgotten_after_a_pause_with_no_samples() -> None:
    """No admissions for a while (between two runs of traffic): the next sample closes a
    window that spans the pause, which says nothing about the cost now."""
    st = Streams()
    front = FrontModel(open_streams=lambda: st.open, alpha=1.0, stale_s=10.0)
    st.open = 10
    front.sample(now=0.0, cpu_s=0.0)
    front.sample(now=1.0, cpu_s=1.0)  # learned under an overload
    front.sample(now=16.0, cpu_s=1.2)  # 15 s of nothing
    assert front.share(5) is None  # admission admits and measures again
    front.sample(now=17.0, cpu_s=1.3)  # a fresh window: 0.1 of a core for 10 streams
    assert front.share(5) == pytest.approx(0.05)
