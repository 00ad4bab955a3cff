"""Manual GPU smoke run (not collected by pytest): the 0.6B/1.7B presets on CUDA in bf16.

    PYTHONPATH=services/tts/src python3 services/tts/tests/engine/gpu_smoke.py [0.6b|1.7b]

Checks that the engine runs on a GPU at the released shapes and prints rough step times,
batched-vs-solo agreement (bf16: informational) and streaming-decoder agreement.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import torch
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineSettings,
    SamplingParams,
    SessionParams,
    UtteranceEnd,
)
from voice_tts.engine.model import DecoderState

TEXTS = ["Hello there, streaming world.", "你好，欢迎使用语音合成服务。",
         "Real-time voice agents speak while the model writes.", "One more session, please."]


def main(preset: str) -> None:
    t0 = time.perf_counter()
    engine = Engine.from_preset(preset, device="cuda",
                                settings=EngineSettings(max_sessions=8, max_seq_len=1024))
    out: dict = {"preset": preset, "build_s": round(time.perf_counter() - t0, 1),
                 "gpu": torch.cuda.get_device_name()}
    greedy = SamplingParams.greedy()
    engine.synthesize("Warm up.", "vivian", sampling=greedy, max_frames=4)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    solo = [engine.synthesize(t, "vivian", sampling=greedy, max_frames=24, return_codes=True)
            for t in TEXTS]
    torch.cuda.synchronize()
    out["solo_ms_per_frame"] = round((time.perf_counter() - t0) * 1e3 / (24 * len(TEXTS)), 2)
    stats = []
    engine.on_step = stats.append
    engine.start()
    done = [threading.Event() for _ in TEXTS]
    packets: list[list[AudioPacket]] = [[] for _ in TEXTS]

    def sink_for(i):
        def sink(ev):
            if isinstance(ev, AudioPacket):
                packets[i].append(ev)
            elif isinstance(ev, UtteranceEnd):
                done[i].set()
        return sink

    sessions = [engine.open_session(SessionParams(voice="vivian", sampling=greedy,
                                                  max_frames=24), sink_for(i))
                for i in range(len(TEXTS))]
    for s, t in zip(sessions, TEXTS, strict=True):
        s.push_text(t)
        s.flush()
    for d in done:
        assert d.wait(120)
    engine.shutdown()
    out["first_packet_ms"] = [round(p[0].timings["first_packet_ms"], 1) for p in packets]
    batched = [b for b in stats if b.batch_size == len(TEXTS)]
    out["batch4_step_ms"] = round(float(np.median([b.step_ms for b in batched])), 2) \
        if batched else None
    out["batch4_talker_ms"] = round(float(np.median([b.talker_ms for b in batched])), 2) \
        if batched else None
    out["batch4_cp_ms"] = round(float(np.median([b.code_predictor_ms for b in batched])), 2) \
        if batched else None
    out["batched_equals_solo_codes"] = [
        bool(np.array_equal(np.concatenate([p.codes for p in pk]), sc))
        for pk, (_, sc) in zip(packets, solo, strict=True)]
    codes = torch.from_numpy(solo[0][1]).T[None].cuda()
    dec = engine.model.speech_decoder
    with torch.no_grad():
        whole = dec(codes)[0].float()
        st, parts, i, n = DecoderState(), [], 0, 1
        while i < codes.shape[-1]:
            parts.append(dec(codes[..., i:i + n], st)[0].float())
            i, n = i + n, 4
        streamed = torch.cat(parts)
    err = (streamed - whole)
    out["decoder_stream_max_abs_bf16"] = float(err.abs().max())
    out["decoder_stream_snr_db_bf16"] = float(10 * torch.log10(whole.pow(2).sum()
                                                               / err.pow(2).sum().clamp(1e-30)))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "0.6b")
