"""Churn: sessions come and go at random steps the way open-loop traffic makes them.

Sessions open, stream text in pieces, FLUSH, STOP, RESET, cancel and close at random
engine iterations; EOS is boosted (the tiny checkpoint's EOS row, lib.EOS_BOOST) so that
default sampling reaches it; prompts of many lengths (voices, languages, instructions,
offline text); more sessions than slots over time. The runner mimics the CUDA graphs
(`Runner.mimic_graphs`: batches padded with scratch-slot rows, audio one iteration late)
and checks every index a step uses. Asserted: no engine fault, each utterance's packets
contiguous and ended once, nothing of a stopped utterance after its stop, every slot
back at the end.

This test found the GPU fault of open-loop traffic: the padding rows of a graph bucket
all point at the scratch slot, whose position grew by one every padded step until it
wrote past the KV cache (and whose sampled codec EOS reached the speech decoder).
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineSettings,
    SamplingParams,
    SessionParams,
    UtteranceEnd,
)
from voice_tts.engine.graphs import buckets_for

WORDS = ('the', 'quick', 'brown', 'fox', 'jumps', 'over', 'a', 'lazy', 'dog', 'while',
         'streaming', 'voices', 'answer', 'questions', 'about', 'weather', 'trains',
         'music', 'and', 'time', '你好', '世界', 'bonjour', 'à', 'tous', '123', '4.5%', '—',
         'okay!')


class Client:
    """One session and what it saw; checks the stream as events arrive."""

    def __init__(self, engine: Engine, rng: random.Random, params: SessionParams) -> None:
        self.session = engine.open_session(params, self.sink)
        self.rng = rng
        self.next_frame: dict[int, int] = defaultdict(int)
        self.ended: dict[int, UtteranceEnd] = {}
        self.stopped: set[int] = set()  # utterance ids dropped by STOP/RESET/close
        self.errors: list[str] = []

    def sink(self, ev) -> None:
        uid = ev.utterance_id
        if uid in self.ended:
            self.errors.append(f"{type(ev).__name__} of utterance {uid} after its end")
        if isinstance(ev, AudioPacket):
            if uid in self.stopped:
                self.errors.append(f"audio of utterance {uid} after its STOP")
            if ev.first_frame != self.next_frame[uid]:
                self.errors.append(f"utterance {uid}: frame {ev.first_frame}, expected "
                                   f"{self.next_frame[uid]}")
            self.next_frame[uid] = ev.first_frame + ev.frames
        else:
            self.ended[uid] = ev
            if ev.reason != "cancelled" and ev.frames != self.next_frame[uid]:
                self.errors.append(f"utterance {uid} ended at {ev.frames} frames, sent "
                                   f"{self.next_frame[uid]}")

    def stop(self, reset: bool) -> None:
        s = self.session
        if reset:
            s.reset(self.rng.randrange(1 << 30))
        else:
            s.cancel()
        # Every utterance opened so far is dropped (ids count up from 0).
        self.stopped.update(u for u in range(s._next_utt) if u not in self.ended)


def _params(rng: random.Random, engine: Engine) -> SessionParams:
    voices = engine.voices()
    voice = rng.choice(voices).name
    language = rng.choice(engine.languages())
    instruct = " ".join(rng.choices(WORDS, k=rng.randrange(1, 12))) \
        if engine.cfg.supports_instruct and rng.random() < 0.5 else ""
    greedy = rng.random() < 0.2
    return SessionParams(voice=voice, language=language, instruct=instruct,
                         seed=rng.randrange(1 << 30),
                         sampling=SamplingParams.greedy() if greedy else SamplingParams(),
                         non_streaming_mode=rng.random() < 0.15,
                         max_frames=rng.choice([None, None, rng.randrange(1, 40)]))


SETTINGS = EngineSettings(max_sessions=5, max_batch=5, max_seq_len=96,
                          max_prefills_per_step=3, packet_frames=2)


@pytest.mark.parametrize("name", ["tiny", "tiny-1.7b"])
def test_random_churn_never_faults_and_frees_every_slot(checkpoints, name):
    engine = Engine.from_pretrained(checkpoints[name], settings=SETTINGS)
    engine.runner.mimic_graphs(buckets_for(SETTINGS.max_batch))
    churn(engine, random.Random(f"churn-{name}"))
    assert engine.runner.eager_buckets is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["tiny", "tiny-1.7b"])
def test_random_churn_on_cuda_graphs(checkpoints, name):
    """The same churn through the captured graphs and fused kernels (the GPU path)."""
    engine = Engine.from_pretrained(checkpoints[name], device="cuda", settings=SETTINGS)
    assert engine.runner.graphs is not None
    churn(engine, random.Random(f"churn-{name}"))
    torch.cuda.synchronize()
    scratch = engine.runner.scratch_slot
    assert engine.runner.state.position[scratch].item() < SETTINGS.max_seq_len


def churn(engine: Engine, rng: random.Random) -> None:
    settings = engine.settings
    clients: list[Client] = []
    closed: list[Client] = []
    opened = 0
    for _ in range(350):  # >3x the KV length in padded steps: the scratch-slot fault shows by ~100
        if len(clients) < settings.max_sessions and rng.random() < 0.25:
            clients.append(Client(engine, rng, _params(rng, engine)))
            opened += 1
        for c in list(clients):
            r = rng.random()
            s = c.session
            if r < 0.25:  # a piece of text, as an LLM streams it
                piece = " ".join(rng.choices(WORDS, k=rng.randrange(1, 6)))
                s.push_text(piece[: rng.randrange(1, len(piece) + 1)] + " ")
            elif r < 0.30:
                s.flush()
            elif r < 0.32:
                c.stop(reset=False)
            elif r < 0.34:
                c.stop(reset=True)
            elif r < 0.36:  # the client goes away mid-stream
                c.stop(reset=False)
                s.close()
                clients.remove(c)
                closed.append(c)
        engine.run_once()
    for c in clients:  # the rest speak to their end, then leave
        c.session.flush()
    for _ in range(400):
        if not engine.run_once():
            break
    for c in clients:
        c.stop(reset=False)
        c.session.close()
    for _ in range(5):
        engine.run_once()

    everyone = clients + closed
    errors = [e for c in everyone for e in c.errors]
    assert not errors, errors[:10]
    assert engine.faults == 0, "engine work failed under churn (see the log)"
    assert engine.active_sessions == 0
    assert sorted(engine.scheduler.free_slots) == list(range(settings.max_sessions))
    reasons = [e.reason for c in everyone for e in c.ended.values()]
    assert opened > settings.max_sessions * 3, "more sessions than slots over time"
    # The run took every way out of an utterance (else it proved less than it claims).
    assert {"eos", "max_frames", "cancelled"} <= set(reasons), sorted(set(reasons))
