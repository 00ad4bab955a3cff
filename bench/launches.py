"""Kernel launches per decode step, by part (code predictor / talker / speech decoder), for
the plain-PyTorch path and the fused Triton path, at batch 1 — measured on CPU, no GPU.

A graphed step on the GPU was bound by how many kernels it launches (the code predictor:
15 tokens x 5 layers per frame). This counts them: every ATen op that computes (views and
allocations excluded, as they launch nothing) plus every Triton launch, with the Triton
kernels run by the interpreter (their own internals are not counted).

  TRITON_INTERPRET=1 python -m bench.launches --preset 0.6b
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NO_LAUNCH = {"view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "t",
             "transpose", "permute", "as_strided", "alias", "detach", "split",
             "split_with_sizes", "unbind", "reshape", "_reshape_alias", "lift_fresh",
             "chunk", "empty", "empty_like", "empty_strided"}
PARTS = ("talker", "code_predictor", "decoder")  # in step order


class LaunchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.aten = self.triton = 0
        self._in_triton = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_triton and func.overloadpacket.__name__ not in NO_LAUNCH:
            self.aten += 1
        return func(*args, **(kwargs or {}))

    def wrap(self, fn):
        def launch(*args, **kwargs):
            self.triton += 1
            self._in_triton = True  # the interpreter's own tensor ops are not launches
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_triton = False
        return launch


def count(preset: str, fused: bool) -> dict[str, dict[str, int]]:
    from voice_tts.engine import Engine, EngineSettings, SamplingParams, kernels
    from voice_tts.engine.runner import PrefillRequest

    counter = LaunchCounter()
    # The engine calls every kernel as kernels.<name>: count there.
    saved = {name: getattr(kernels, name) for name in kernels.__all__
             if name[0].islower() and name not in ("active", "interpret_on_cpu")}
    for name, fn in saved.items():
        setattr(kernels, name, counter.wrap(fn))
    ctx = kernels.interpret_on_cpu() if fused else contextlib.nullcontext()
    try:
        with ctx, torch.no_grad():
            engine = Engine.from_preset(preset, seed=0, settings=EngineSettings(
                max_sessions=1, max_seq_len=256, cuda_graphs=False))
            r, t = engine.runner, engine.cfg.talker
            r.prefill([(PrefillRequest(slot=0, role_ids=[1, 2, 3], codec_prefix=[
                t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id],
                speaker_id=None, text_ids=[5]), SamplingParams(), 1)])
            slots = torch.tensor([0])
            text, talk = torch.tensor([engine.cfg.tts_pad_token_id]), torch.tensor([1])
            r.step_cp(slots)  # frame 0 (a row's first step): its track for the talker
            out, state = {}, {}
            steps = {"talker": lambda: r.step_talker(slots, text, talk, 256),
                     "code_predictor": lambda: state.update(zip(
                         ("frame", "decode"), r.step_cp(slots), strict=True)),
                     "decoder": lambda: r.step_decoder(state["decode"], state["frame"])}
            for part in PARTS:
                counter.aten = counter.triton = 0
                with counter:
                    steps[part]()
                out[part] = {"aten": counter.aten, "triton": counter.triton,
                             "total": counter.aten + counter.triton}
            engine.shutdown()
    finally:
        for name, fn in saved.items():
            setattr(kernels, name, fn)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="0.6b")
    p.add_argument("--out", help="write the counts as JSON here")
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        p.error("run with TRITON_INTERPRET=1 (the fused kernels run in Triton's interpreter)")
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    result = {"preset": args.preset, "plain": count(args.preset, False),
              "fused": count(args.preset, True)}
    print(f"{'part':<16}{'plain':>8}{'fused':>8}{'ratio':>8}")
    for part in (*PARTS, "step"):
        a = (sum(v["total"] for v in result["plain"].values()) if part == "step"
             else result["plain"][part]["total"])
        b = (sum(v["total"] for v in result["fused"].values()) if part == "step"
             else result["fused"][part]["total"])
        print(f"{part:<16}{a:>8}{b:>8}{a / b:>7.1f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
