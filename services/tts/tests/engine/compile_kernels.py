"""Compile every Triton kernel of the decode path for Hopper (sm_90) at the real shapes,
bf16 and float32, with programmatic dependent launch (PDL), without a GPU (Triton's own
ptxas): a kernel that the interpreter accepts but the compiler rejects fails here, not
on the device. Run by test_kernels.py
in a process without TRITON_INTERPRET. Prints one line per kernel variant."""

from __future__ import annotations

import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from voice_tts.engine.kernels import cache_attention, layer_ops, sampling

FLOATS = {"eps", "scale"}


def compile_for_hopper(kernel, pointers: dict[str, str], constexprs: dict) -> None:
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: pointers.get(n) or ("constexpr" if n in constexprs else
                                        "fp32" if n in FLOATS else "i32") for n in names}
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm.get("cubin"), kernel.fn.__name__
    print(kernel.fn.__name__, sorted(constexprs.items()), "ok", flush=True)


def main() -> None:
    for dt in ("bf16", "fp32"):
        act = {n: f"*{dt}" for n in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "h_ptr", "qkv_ptr",
                                     "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "q_ptr",
                                     "kc_ptr", "vc_ptr", "gu_ptr", "k_ptr", "v_ptr", "o_ptr",
                                     "logits_ptr")}
        idx = {n: "*i64" for n in ("slots_ptr", "pos_ptr", "topk_ptr", "seed_ptr",
                                   "count_ptr", "out_ptr")}
        ptrs = {**act, **idx, "do_ptr": "*i1", "seen_ptr": "*i1", "sup_ptr": "*i1",
                "temp_ptr": "*fp32", "topp_ptr": "*fp32", "pen_ptr": "*fp32",
                "noise_ptr": "*fp32"}
        for hidden in (1024, 2048):  # 0.6B, 1.7B talker
            compile_for_hopper(layer_ops._rms_norm, ptrs, dict(N=hidden, BLOCK=hidden,
                                                                ADD=True, PDL=True))
        compile_for_hopper(layer_ops._qk_norm_rope_write, ptrs,
                           dict(H=16, KVH=8, D=128, NH_PAD=32, PDL=True))
        compile_for_hopper(layer_ops._silu_mul, ptrs, dict(N=3072, BLOCK=1024))
        compile_for_hopper(layer_ops._snake_beta, {**ptrs, "a_ptr": ptrs["x_ptr"],
                                                   "b_ptr": ptrs["x_ptr"]}, dict(BLOCK=1024))
        compile_for_hopper(cache_attention._attention, ptrs, dict(
            REP=2, REP_PAD=16, D=128, BLOCK_N=64, PREC="ieee" if dt == "fp32" else "tf32",
            PDL=True))
        # code predictor, talker; and the talker with a given noise (the tests' variant)
        for v, masks, given in ((2048, False, False), (3072, True, False), (3072, True, True)):
            compile_for_hopper(sampling._sample, ptrs, dict(
                V=v, VP=triton.next_power_of_2(v), MASKS=masks, MIN_NEW=2, GIVEN_NOISE=given,
                PDL=dt == "bf16"))


if __name__ == "__main__":
    main()
