"""Compile every Triton kernel of kernels/ for CUDA targets without a GPU (ahead of time, through
ptxas to a cubin), so that CPU-only CI catches what the interpreter lets through (non-constexpr
globals, tl.dot shapes under 16, type errors of the compiled dialect).

    python -m tests.triton_compile 80 90      # compute capabilities; run without TRITON_INTERPRET
"""
from __future__ import annotations

import os
import sys

CONSTS_ATTN = dict(HEAD_DIM=64, BLOCK_D=64, GROUP=3, GROUP_PAD=4, BLOCK_Q=4, TILE_N=32)


def _signature(fn, consts: dict, pointer: str, overrides: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointer
        else:
            sig[name] = "i32"
    sig.update(overrides)
    return sig


def cases():
    """(kernel, constexprs, signature) for every specialisation the wrappers launch."""
    from kernels import triton_attention as ta, triton_fused as tf

    ints = {"qsl_ptr": "*i64", "kv_lens_ptr": "*i64", "tables_ptr": "*i64", "win_ptr": "*i32", "mrow_ptr": "*i32",
            "mask_ptr": "*i8", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "scale_log2": "fp32"}
    for dtype in ("bf16", "fp32"):
        for tree in (False, True):
            for segments in (1, 8):
                consts = dict(CONSTS_ATTN, NUM_SEGMENTS=segments, HAS_TREE=tree, DOT_FP32=dtype == "fp32")
                yield ta._attn_kernel, consts, _signature(ta._attn_kernel, consts, "*" + dtype, ints)
    consts = dict(HEAD_DIM=64, BLOCK_D=64, NUM_SEGMENTS=8)
    yield ta._reduce_kernel, consts, _signature(ta._reduce_kernel, consts, "*fp32", {"out_ptr": "*bf16"})
    for dtype in ("bf16", "fp32"):
        consts = dict(BLOCK=1024, IS_FP32=dtype == "fp32")
        yield tf._rmsnorm_residual_kernel, consts, _signature(tf._rmsnorm_residual_kernel, consts, "*" + dtype,
                                                              {"eps": "fp32"})
        consts = dict(BLOCK=1024)
        yield tf._silu_and_mul_kernel, consts, _signature(tf._silu_and_mul_kernel, consts, "*" + dtype, {})
        consts = dict(NUM_HEADS=9, NUM_KV_HEADS=3, HALF=32, BLOCK_HALF=32, BLOCK_HEADS=16)
        yield tf._rope_write_kv_kernel, consts, _signature(tf._rope_write_kv_kernel, consts, "*" + dtype,
                                                           {"slot_ptr": "*i64"})


def main(archs: list[int]) -> int:
    if os.environ.get("TRITON_INTERPRET") not in (None, "", "0"):
        raise SystemExit("run without TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for arch in archs:
        for fn, consts, sig in cases():
            compiled = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", arch, 32))
            assert "cubin" in compiled.asm, f"{fn.__name__} sm_{arch}: no cubin"
            print(f"sm_{arch} {fn.__name__} {consts}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [80, 90]))
