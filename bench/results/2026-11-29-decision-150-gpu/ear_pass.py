"""The ear's pass (voice_agent/moonshine.py) with its ONNX Runtime sessions made as the
moonshine library makes them (weights not prepacked, no memory arena) and otherwise: time
a pass, and whether the words and the end probability stay the same. One thread, the
first 60 turns of each folder, cut where the speaker stopped + 100 ms:

    .venv/agent/bin/python bench/results/2026-11-29-decision-150-gpu/ear_pass.py \\
        /tmp/dialogset /tmp/turnset
"""
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import voice_agent.moonshine as vm
from voice_agent.onnx import session_options

from bench.turn_folder import load_16k, read_folder

EXTENDED = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
CONFIGS = {  # name: (prepack, arena, optimization level)
    "the library's": (False, False, EXTENDED),
    "prepacked (the agent's now)": (True, False, EXTENDED),
    "prepacked + arena": (True, True, EXTENDED),
    "arena": (False, True, EXTENDED),
    "prepacked + arena, ORT_ENABLE_ALL": (True, True, ALL),
}


def ear(prepack: bool, arena: bool, level: ort.GraphOptimizationLevel) -> vm.Moonshine:
    m = vm.Moonshine(1)  # its bookkeeping; the two sessions made again below
    opts = session_options(1)
    opts.graph_optimization_level = level
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.enable_cpu_mem_arena = arena
    opts.log_severity_level = 3
    path, cpu = vm.model_dir(), ["CPUExecutionProvider"]
    m.encoder = ort.InferenceSession(str(path / "encoder_model.ort"), opts, providers=cpu)
    m.decoder = ort.InferenceSession(str(path / "decoder_model_merged.ort"), opts,
                                     providers=cpu)
    return m


def main() -> None:
    clips = [load_16k(Path(f) / t.audio)[:int((t.stop_s + 0.1) * 16000)]
             for f in sys.argv[1:] for t in read_folder(Path(f))[:60]]
    base = None
    for name, config in CONFIGS.items():
        m = ear(*config)
        m.hear(clips[0])  # warm
        t0 = time.perf_counter()
        heard = [m.hear(c) for c in clips]
        ms = (time.perf_counter() - t0) / len(clips) * 1e3
        base = base or heard
        same = sum(h[0] == b[0] for h, b in zip(heard, base, strict=True))
        dp = max(abs(h[1] - b[1]) for h, b in zip(heard, base, strict=True))
        print(f"{name:34s} {ms:5.1f} ms a pass; the same words {same}/{len(clips)}, "
              f"max |p_end difference| {dp:.2g}; mean clip "
              f"{np.mean([len(c) for c in clips]) / 16000:.1f} s")


if __name__ == "__main__":
    main()
