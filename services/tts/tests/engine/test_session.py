"""The session API: flush ends an utterance, cancel stops output at once, sessions
interleaved in one engine (continuous batching) equal their solo runs, slots, ids."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineFull,
    EngineSettings,
    SamplingParams,
    SessionParams,
    StepStats,
    UtteranceEnd,
)

TEXTS = ["Hello there, streaming world.", "你好，欢迎使用语音合成服务。",
         "Real-time voice agents speak while the model writes."]


class Collector:
    def __init__(self) -> None:
        self.events: list = []
        self.ended = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, ev) -> None:
        with self.lock:
            self.events.append(ev)
        if isinstance(ev, UtteranceEnd):
            self.ended.set()

    def packets(self, utt: int | None = None) -> list[AudioPacket]:
        return [e for e in self.events if isinstance(e, AudioPacket)
                and (utt is None or e.utterance_id == utt)]

    def ends(self) -> list[UtteranceEnd]:
        return [e for e in self.events if isinstance(e, UtteranceEnd)]


@pytest.fixture
def engine():
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
    e.start()
    yield e
    e.shutdown()


def test_flush_produces_utterance_end(engine):
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=9), c)
    s.push_text("Hello there.")
    s.flush()
    assert c.ended.wait(30)
    (end,) = c.ends()
    assert end.utterance_id == 0 and end.reason == "max_frames" and end.frames == 9
    packets = c.packets()
    # The packet ramp (api.packet_ramp): each at most half the audio already sent.
    assert [p.frames for p in packets] == [1, 1, 1, 1, 2, 3]
    assert [p.first_frame for p in packets] == [0, 1, 2, 3, 4, 6]
    assert all(p.pcm.dtype == np.float32 and len(p.pcm) == p.frames * 1920 for p in packets)
    assert set(packets[0].timings) == {"queue_ms", "prefill_ms", "first_packet_ms"}
    assert all(p.timings is None for p in packets[1:])
    # The next push opens utterance 1.
    c.ended.clear()
    s.push_text("Again.")
    assert s.utterance_id == 1
    s.flush()
    assert c.ended.wait(30)
    assert c.ends()[-1].utterance_id == 1
    s.close()
    assert engine.active_sessions == 0


def test_cancel_stops_output_now(engine):
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=60), c)
    s.push_text("A long utterance that would run for sixty frames if left alone.")
    s.flush()
    t0 = time.monotonic()
    while not c.packets() and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    assert c.packets(), "no audio"
    s.cancel()
    n_after_cancel = len(c.packets(0))
    time.sleep(0.3)  # the engine keeps running: nothing more of utterance 0 may arrive
    assert len(c.packets(0)) == n_after_cancel
    assert c.ended.wait(5)
    end = c.ends()[0]
    assert end.reason == "cancelled" and end.utterance_id == 0
    assert end.frames == sum(p.frames for p in c.packets(0)) < 60
    # The session is reusable; the next utterance has a new id.
    c.ended.clear()
    s.push_text("Next one.")
    s.flush()
    assert c.ended.wait(30)
    assert c.ends()[-1].utterance_id == 1 and c.ends()[-1].reason != "cancelled"
    s.close()


def _solo(engine: Engine, text: str, seed: int, sampling: SamplingParams) -> np.ndarray:
    return engine.synthesize(text, "vivian", seed=seed, sampling=sampling, max_frames=14,
                             return_codes=True)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams.greedy()],
                         ids=["sampled", "greedy"])
def test_interleaved_sessions_equal_solo(sampling):
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
    solo = [_solo(engine, t, seed=10 + i, sampling=sampling) for i, t in enumerate(TEXTS)]
    batch_sizes: list[int] = []
    engine.on_step = lambda st: batch_sizes.append(st.batch_size)
    engine.start()
    try:
        collectors = [Collector() for _ in TEXTS]
        sessions = [engine.open_session(SessionParams(voice="vivian", seed=10 + i,
                                                      sampling=sampling, max_frames=14), c)
                    for i, c in enumerate(collectors)]
        # Feed the three texts interleaved, piece by piece, with small pauses: sessions
        # join and leave the batch between steps.
        data = [t.encode() for t in TEXTS]
        for k in range(0, max(map(len, data)), 3):
            for s, d in zip(sessions, data, strict=True):
                if k < len(d):
                    s.push_text(d[k:k + 3])
            time.sleep(0.002)
        for s in sessions:
            s.flush()
        for c in collectors:
            assert c.ended.wait(60)
    finally:
        engine.shutdown()
    assert max(batch_sizes) > 1, "never batched"
    for (pcm, codes), c in zip(solo, collectors, strict=True):
        got = np.concatenate([p.codes for p in c.packets()])
        assert np.array_equal(got, codes)
        assert np.abs(np.concatenate([p.pcm for p in c.packets()]) - pcm).max() <= 1e-4


def test_reset_reseeds(engine):
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=5, max_frames=6), c)
    for _ in range(2):
        c.ended.clear()
        s.push_text("Same text.")
        s.flush()
        assert c.ended.wait(30)
        s.reset()  # fresh generator: the same seed again
    a, b = (np.concatenate([p.pcm for p in c.packets(u)]) for u in (0, 1))
    assert np.array_equal(a, b)
    s.reset(seed=6)
    c.ended.clear()
    s.push_text("Same text.")
    s.flush()
    assert c.ended.wait(30)
    assert not np.array_equal(a, np.concatenate([p.pcm for p in c.packets(2)]))
    s.close()


def test_engine_full_and_slots(engine):
    sessions = [engine.open_session(SessionParams(voice="vivian"), Collector())
                for _ in range(4)]
    with pytest.raises(EngineFull):
        engine.open_session(SessionParams(voice="vivian"), Collector())
    sessions[0].close()
    sessions[0].close()  # idempotent
    assert engine.active_sessions == 3
    sessions.append(engine.open_session(SessionParams(voice="vivian"), Collector()))
    for s in sessions[1:]:
        s.close()
    assert engine.active_sessions == 0
    with pytest.raises(ValueError):
        sessions[1].push_text("closed")


def test_metadata_and_step_hook(engine):
    assert engine.sample_rate == 24000 and engine.frame_samples == 1920
    assert "auto" in engine.languages() and "english" in engine.languages()
    assert not any("dialect" in lang for lang in engine.languages())
    voices = {v.name: v for v in engine.voices()}
    assert voices["dylan"].dialect == "beijing_dialect" and voices["vivian"].dialect is None
    assert engine.model_name == "preset:tiny"
    stats: list[StepStats] = []
    engine.on_step = stats.append
    engine.synthesize("Hi there.", "vivian", max_frames=3)
    assert stats and all(st.batch_size >= 1 and st.step_ms > 0 for st in stats)


def test_speaks_the_first_stable_token_then_waits_for_text(tiny_engine):
    c = Collector()
    s = tiny_engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=50), c)
    s.push_text("Hello")  # the first word may still grow: no prompt yet
    for _ in range(5):
        tiny_engine.run_once()
    assert not c.events
    s.push_text(" wor")  # "Hello" is stable now: prompt + steps while text lasts
    for _ in range(10):
        tiny_engine.run_once()
    # One text token ("Hello") per prompt, which begins frame 0: it is spoken at once.
    # Frame t > 0 needs text token t: " wor" is not stable yet, so it waits there.
    assert [(p.first_frame, p.frames) for p in c.packets()] == [(0, 1)]
    s.push_text("ld, and more text.")
    for _ in range(10):
        tiny_engine.run_once()
    assert c.packets() and not c.ends()  # speaking what is known, waiting for the rest
    n = sum(p.frames for p in c.packets())
    for _ in range(10):
        tiny_engine.run_once()
    assert sum(p.frames for p in c.packets()) == n  # no flush, no new text: it waits
    s.flush()
    while not c.ends():
        tiny_engine.run_once()
    assert c.ends()[0].reason in ("eos", "max_frames")
    s.close()


def test_a_step_of_first_steps_only_skips_the_talker(tiny_engine):
    """A prompt that arrives alone takes its first step (frame 0, sampled by its prompt)
    without a talker pass; once a row talks, the talker runs for the batch."""
    talker_rows: list[int] = []
    hook = tiny_engine.model.talker.register_forward_hook(
        lambda mod, args, out: talker_rows.append(out.shape[1]))
    try:
        a, b = Collector(), Collector()
        sa = tiny_engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=6), a)
        sa.push_text("Hello world.")
        sa.flush()
        tiny_engine.run_once()  # prompt (many rows) + its first step (none)
        assert len(talker_rows) == 1 and talker_rows[0] > 1 and a.packets()
        tiny_engine.run_once()  # its second frame: the talker steps (one row)
        assert talker_rows[1:] == [1]
        sb = tiny_engine.open_session(SessionParams(voice="vivian", seed=2, max_frames=6), b)
        sb.push_text("Hi there.")
        sb.flush()
        tiny_engine.run_once()  # b's prompt, then one step: a talks, b's first step rides
        assert talker_rows[2] > 1 and talker_rows[3:] == [1] and b.packets()
        while not (a.ends() and b.ends()):
            tiny_engine.run_once()
        sa.close()
        sb.close()
    finally:
        hook.remove()


def test_text_after_flush_is_the_next_utterance(tiny_engine):
    c = Collector()
    s = tiny_engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=6), c)
    s.push_text("First one.")
    s.flush()
    s.push_text("Second one.")
    s.flush()
    while len(c.ends()) < 2:
        tiny_engine.run_once()
    order = [(type(e).__name__, e.utterance_id) for e in c.events]
    first_end = order.index(("UtteranceEnd", 0))
    assert all(u == 0 for _, u in order[:first_end + 1])
    assert all(u == 1 for _, u in order[first_end + 1:])
    s.close()


def test_frame_cap_before_flush_drops_text_until_flush(tiny_engine):
    c = Collector()
    s = tiny_engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=3), c)
    s.push_text("This sentence streams on and on, word after word, ")
    while not c.ends():
        tiny_engine.run_once()
    (end,) = c.ends()
    assert end.reason == "max_frames" and end.frames == 3
    # Text until the flush belongs to the truncated utterance: dropped.
    s.push_text("and more words for the capped utterance ")
    assert s.utterance_id == 0
    s.flush()
    for _ in range(5):
        tiny_engine.run_once()
    assert len(c.ends()) == 1 and sum(p.frames for p in c.packets()) == 3
    s.push_text("A new one.")  # after the flush: the next utterance
    assert s.utterance_id == 1
    s.flush()
    while len(c.ends()) < 2:
        tiny_engine.run_once()
    assert c.ends()[1].utterance_id == 1 and c.packets(1)
    # A cancel (or reset) closes a truncated utterance too.
    s.push_text("Another long sentence that streams on, word after word, ")
    while len(c.ends()) < 3:
        tiny_engine.run_once()
    assert c.ends()[2].reason == "max_frames"
    s.cancel()
    s.push_text("Spoken again.")
    assert s.utterance_id == 3
    s.close()


def test_model_end_before_flush_drops_text_until_flush():
    """The model may end an utterance (codec EOS) while its text still streams: the
    rest until the flush is dropped, as after the frame cap, so ids stay one per flush.
    (It opened a new utterance before: a client waiting for the first one's FLUSHED
    waited forever.) The tiny random weights never sample EOS: the test hook makes the
    3rd step's token EOS."""
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
        max_sessions=1, fault="eos@3"))
    try:
        c = Collector()
        s = engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=40), c)
        s.push_text("This sentence streams on and on, word after word, ")
        while not c.ends():
            engine.run_once()
        (end,) = c.ends()
        made = sum(p.frames for p in c.packets())
        assert end.reason == "eos" and end.frames == made == 3
        s.push_text("and the words after the model's end ")
        assert s.utterance_id == 0
        s.flush()
        for _ in range(5):
            engine.run_once()
        assert len(c.ends()) == 1 and sum(p.frames for p in c.packets()) == made
        s.push_text("A new one.")  # after the flush: the next utterance
        assert s.utterance_id == 1
        s.flush()
        while len(c.ends()) < 2:
            engine.run_once()
        assert c.ends()[1].utterance_id == 1 and c.packets(1)
        s.close()
    finally:
        engine.shutdown()


def test_audio_read_one_step_late_gives_the_same_events():
    """With CUDA graphs a step's audio is read after the next step is launched (its
    decoder runs beside that step: `runner.Step.pipelined`). The engine must send the same
    packets, ends and order as when the audio comes with the tokens: here the eager steps
    are handed over as pipelined ones. Two utterances per session (the second starts after
    the first one's last audio), different frame limits, sessions in one batch."""

    def events(pipelined: bool) -> list[list]:
        e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
        if pipelined:
            e.runner.mimic_graphs()  # no padding rows: the same batches
        collectors = [Collector() for _ in TEXTS]
        for i, (c, text) in enumerate(zip(collectors, TEXTS, strict=True)):
            s = e.open_session(SessionParams(voice="vivian", seed=i, max_frames=4 + 3 * i), c)
            for part in (text, "And then a second one."):
                s.push_text(part)
                s.flush()
        for _ in range(500):
            if all(len(c.ends()) == 2 for c in collectors):
                break
            e.run_once()
        out = []
        for c in collectors:
            assert [end.reason for end in c.ends()] == ["max_frames"] * 2
            assert isinstance(c.events[-1], UtteranceEnd)
            out.append(c.events)
        return out

    def meta(ev) -> tuple:
        if isinstance(ev, AudioPacket):
            return ev.utterance_id, ev.first_frame, ev.frames, ev.final, ev.codes.tolist()
        return ev.utterance_id, ev.frames, ev.reason

    late, now = events(pipelined=True), events(pipelined=False)
    for a, b in zip(late, now, strict=True):
        assert [meta(ev) for ev in a] == [meta(ev) for ev in b]
        # Batches may differ (an utterance ends one iteration later): float sums may too.
        pcm = [np.concatenate([ev.pcm for ev in evs if isinstance(ev, AudioPacket)])
               for evs in (a, b)]
        assert np.abs(pcm[0] - pcm[1]).max() <= 1e-4
        assert sum(1 for ev in b if isinstance(ev, AudioPacket) and ev.final) == 2


@pytest.mark.parametrize("apart", [32, 0])
def test_a_fresh_prompt_beside_a_small_batch_steps_apart_and_is_heard_at_once(apart):
    """Pipelined (as CUDA graphs run), a prompt that arrives while a small batch runs
    takes its first step in a launch of its own, and its first packet is out in the
    iteration that ran its prompt; with `first_step_apart_max_rows=0` it rides the batch's
    step and comes one iteration later. The audio is the same either way."""
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
        max_sessions=4, first_step_apart_max_rows=apart))
    e.runner.mimic_graphs()
    stats: list[StepStats] = []
    e.on_step = stats.append
    a, b = Collector(), Collector()
    sa = e.open_session(SessionParams(voice="vivian", seed=1, max_frames=12), a)
    sa.push_text(TEXTS[0])
    sa.flush()
    for _ in range(3):
        e.run_once()
    sb = e.open_session(SessionParams(voice="vivian", seed=2, max_frames=8), b)
    sb.push_text(TEXTS[2])
    sb.flush()
    steps = len(stats)
    e.run_once()  # b's prompt; its first step apart (or in a's batch)
    assert bool(b.packets()) == bool(apart)
    # Every launch but the apart one reports its stats (the batch's period).
    assert [st.batch_size for st in stats[steps:]] == [1]
    for _ in range(100):
        if a.ends() and b.ends():
            break
        e.run_once()
    assert [x.ends()[0].frames for x in (a, b)] == [12, 8]
    # the same codes as each session alone, pipelined, without the split
    for seed, frames, text, got in ((1, 12, TEXTS[0], a), (2, 8, TEXTS[2], b)):
        solo = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
            max_sessions=4, first_step_apart_max_rows=0))
        solo.runner.mimic_graphs()
        c = Collector()
        s = solo.open_session(SessionParams(voice="vivian", seed=seed, max_frames=frames), c)
        s.push_text(text)
        s.flush()
        while not c.ends():
            solo.run_once()
        np.testing.assert_array_equal(np.concatenate([p.codes for p in got.packets()]),
                                      np.concatenate([p.codes for p in c.packets()]))


@pytest.mark.parametrize("stage", ["launch", "tokens"])
def test_a_failed_apart_first_step_ends_only_the_new_utterance(stage):
    """The 4th launch is the new call's first step, apart from the running one's batch:
    it fails (launched, or as its tokens are read). That call's utterance ends "error" and
    its next one is served; the running call never notices."""
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
        max_sessions=4, fault=f"bug@4:{stage}"))
    e.runner.mimic_graphs()
    a, b = Collector(), Collector()
    sa = e.open_session(SessionParams(voice="vivian", seed=1, max_frames=12), a)
    sa.push_text(TEXTS[0])
    sa.flush()
    for _ in range(3):  # launches 1-3: a alone
        e.run_once()
    sb = e.open_session(SessionParams(voice="vivian", seed=2, max_frames=6), b)
    sb.push_text(TEXTS[2])
    sb.flush()
    e.run_once()  # b's prompt, its first step apart (launch 4: fails), then a's step
    assert [end.reason for end in b.ends()] == ["error"] and not b.packets()
    sb.push_text("And the next one.")
    sb.flush()
    for _ in range(100):
        if a.ends() and len(b.ends()) == 2:
            break
        e.run_once()
    assert [(end.reason, end.frames) for end in a.ends()] == [("max_frames", 12)]
    assert sum(p.frames for p in a.packets()) == 12
    assert [end.reason for end in b.ends()] == ["error", "max_frames"]


def test_a_step_whose_tokens_cannot_be_read_ends_its_utterance():
    """A fault (not a CUDA error: that one is fatal) surfacing as the tokens are read: the
    rows end "error", the engine thread goes on, the next utterance is served."""
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4,
                                                                    fault="bug@3:tokens"))
    c = Collector()
    s = e.open_session(SessionParams(voice="vivian", seed=1, max_frames=20), c)
    s.push_text(TEXTS[0])
    s.flush()
    for _ in range(50):
        e.run_once()
    assert [end.reason for end in c.ends()] == ["error"]
    s.push_text("And the next one.")
    s.flush()
    for _ in range(50):
        e.run_once()
    assert [end.reason for end in c.ends()] == ["error", "max_frames"]


def test_a_failed_step_ends_its_utterances_once_and_the_engine_goes_on():
    """A step that raises ends its rows' utterances ("error") and nothing of them
    follows that end, not even the audio of their step still in flight; the session's
    next utterance is served as usual."""
    # Steps 1-4 went out (packets of 1: the ramp); 5's is in flight when 6's launch fails.
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4,
                                                                    fault="bug@6"))
    e.runner.mimic_graphs()  # audio one iteration late, as with CUDA graphs
    c = Collector()
    s = e.open_session(SessionParams(voice="vivian", seed=1, max_frames=20), c)
    s.push_text(TEXTS[0])
    s.flush()
    for _ in range(50):
        e.run_once()
    assert [end.reason for end in c.ends()] == ["error"]
    assert isinstance(c.events[-1], UtteranceEnd)
    assert sum(p.frames for p in c.packets()) == 4
    s.push_text("And the next one.")
    s.flush()
    for _ in range(50):
        e.run_once()
    second = c.ends()[1:]
    assert [end.reason for end in second] == ["max_frames"] and second[0].frames == 20
    assert isinstance(c.events[-1], UtteranceEnd)


def test_ignore_eos_runs_every_utterance_to_its_frame_cap(checkpoints):
    """`EngineSettings(ignore_eos=True)` (benchmarks): codec EOS is never sampled, so an
    utterance that ends at EOS by default runs to its cap instead."""
    greedy = SamplingParams.greedy()
    frames = {}
    for ignore in (False, True):
        e = Engine.from_pretrained(checkpoints["tiny"],
                                   settings=EngineSettings(max_sessions=1, ignore_eos=ignore))
        _, codes = e.synthesize(TEXTS[0], "vivian", seed=1, sampling=greedy, max_frames=80,
                                return_codes=True)
        frames[ignore] = len(codes)
    assert frames[False] < 80, "the boosted EOS must end it early, or this proves nothing"
    assert frames[True] == 80


@pytest.mark.parametrize("spec", ["cuda", "bug@0", "oops@2", "bug@2:audio"])
def test_a_bad_fault_spec_fails_at_start(spec):
    with pytest.raises(ValueError, match="fault spec"):
        EngineSettings(fault=spec).validate()
