"""The builds of kernels/csrc: named by sources, flags, CPU and torch installation; the portable build
(no AVX-512) and an AVX-512 build without VNNI and VBMI, each checked against the references or this
CPU's build in a subprocess; a dead builder's lock; the kernels turned off."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the portable check imports the references beside the Triton kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels import cpu_build as cb  # noqa: E402
from kernels import cpu_native as cn  # noqa: E402

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")
ROOT = Path(__file__).resolve().parent.parent
# The other instruction sets' builds compile at -O1 (38 s instead of 127 s on 2 cores): the same
# bits as -O3, since without -ffast-math no level reassociates floating point (and -ffp-contract=off
# forbids fused multiply-adds the code did not ask for); what they check is the source's paths.
OPT = "-O1"


def test_the_build_is_named_by_sources_flags_cpu_and_torch(monkeypatch, tmp_path):
    name = cb.build_name()
    assert name.startswith("specray_cpu_") and name == cb.build_name()
    assert cb.build_name(("-mno-avx512f",)) != name
    # another virtual environment's torch (same version): its own build, not a recompile of this one's
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "venv2" / "torch" / "__init__.py"))
    assert cb.build_name() != name


def test_the_portable_build_without_avx512_matches_the_references():
    """CPUs without AVX-512 get the 16-lane arrays of vec16.h: built here with -mno-avx512f, under
    another op namespace, in a fresh process."""
    code = f"""
import torch, torch.nn.functional as F
from kernels import cpu_native as cn
from kernels.triton_fused import silu_and_mul_ref
from kernels.triton_attention import paged_attention_ref
from kernels import cpu_build as cb
cb.build(("-mno-avx512f", "{OPT}"), namespace="specray_cpu_portable")
ops = torch.ops.specray_cpu_portable
assert not ops.has_avx512()
g = torch.Generator().manual_seed(0)
x, w = torch.randn(13, 40, generator=g), torch.randn(37, 40, generator=g)
y = ops.linear(x, ops.pack_linear(w), 37, None)
torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-4)
assert torch.equal(ops.linear(x[:1], ops.pack_linear(w), 37, None)[0], y[0])
from kernels import gguf_blocks as gb
from tests.test_gguf_blocks import random_blocks
xq = torch.randn(30, 64, generator=g)
assert cn.load()
for kind in ("Q4_1", "Q8_0"):  # half scales (a subnormal one), nibbles, int8: widened exactly
    b = random_blocks(kind, 37, 64, seed=2)
    ops.set_product_activations(32)
    assert torch.equal(ops.linear(xq, gb.pack(b), 37, None), ops.linear(xq, ops.pack_linear(gb.dequantize(b)), 37, None))
    for mode in ("int16", "int8"):  # fixed point: the same integers and fp32 steps as the AVX-512 build
        ops.set_product_activations(cn.ACTIVATIONS[mode])
        with cn.activations(mode):
            for m in (1, 13, 30):
                assert torch.equal(ops.linear(xq[:m], gb.pack(b), 37, None), cn.linear(xq[:m], gb.pack(b), 37))
s = torch.randn(4, 2 * 35, generator=g) * 20
torch.testing.assert_close(ops.silu_and_mul(s), silu_and_mul_ref(s), rtol=2e-6, atol=1e-6)
lg = torch.randn(3, 61, generator=g).round()
lg[2, 9] = float("nan")
assert torch.equal(ops.argmax_rows(lg), lg.argmax(-1))
lp = torch.randn(3, 203, generator=g)
assert torch.equal(ops.top_logprobs(lp, 5)[1], torch.log_softmax(lp, -1).topk(5).indices)
k, v = torch.randn(6, 16, 2, 24, generator=g), torch.randn(6, 16, 2, 24, generator=g)
q = torch.randn(5, 4, 24, generator=g)
qsl, lens, tables = torch.tensor([0, 1, 5]), torch.tensor([30, 20]), torch.tensor([[2, 4], [5, 1]])
torch.testing.assert_close(ops.paged_attention(q, k, v, qsl, lens, tables, 0.2, []),
                           paged_attention_ref(q, k, v, qsl, lens, tables, 0.2), rtol=2e-5, atol=2e-5)
k16, v16, q16 = torch.randn(6, 16, 2, 32, generator=g).bfloat16(), torch.randn(6, 16, 2, 32, generator=g).bfloat16(), torch.randn(5, 4, 32, generator=g)
assert torch.equal(ops.paged_attention(q16, k16, v16, qsl, lens, tables, 0.2, []),
                   ops.paged_attention(q16, k16.float(), v16.float(), qsl, lens, tables, 0.2, []))
print("portable ok")
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "portable ok" in res.stdout, res.stdout + res.stderr


@pytest.mark.skipif(not cn.load() or not cn.has_avx512(), reason="needs the AVX-512 build to compare with")
def test_avx512_without_vnni_or_vbmi_gets_the_same_fixed_point_products():
    """AVX-512 CPUs without VNNI (or VBMI) build vec16.h's fallbacks for vpdpwssd/vpdpbusd (and the
    byte permute): the same integers, so the same bits as this CPU's build."""
    code = f"""
import torch
from kernels import cpu_native as cn
from kernels import gguf_blocks as gb
from tests.test_gguf_blocks import random_blocks
from kernels import cpu_build as cb
cb.build(("-mno-avx512vnni", "-mno-avx512vbmi", "{OPT}"), namespace="specray_cpu_novnni")
ops = torch.ops.specray_cpu_novnni
assert ops.has_avx512() and cn.load()
x = torch.randn(30, 64, generator=torch.Generator().manual_seed(1))
for kind in ("Q4_1", "Q8_0"):
    b = random_blocks(kind, 37, 64, seed=2)
    for mode in ("int16", "int8"):
        ops.set_product_activations(cn.ACTIVATIONS[mode])
        with cn.activations(mode):
            for m in (1, 13, 30):
                assert torch.equal(ops.linear(x[:m], gb.pack(b), 37, None), cn.linear(x[:m], gb.pack(b), 37))
print("fallbacks ok")
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "fallbacks ok" in res.stdout, res.stdout + res.stderr


def test_a_builder_that_died_leaves_no_lock_that_blocks_the_next():
    """torch's FileBaton waits forever on the lock file of a build whose process was killed (a Ray
    worker killed mid-build did that): the next process removes it under its own flock and loads."""
    name = cn._state["name"]
    stale = cb.build_root() / name / "lock"
    stale.write_text("")
    res = subprocess.run([sys.executable, "-m", "kernels.cpu_native"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert f"ready: {name}" in res.stdout, res.stdout + res.stderr
    assert not stale.exists()


def test_turned_off_the_model_keeps_onednn_and_torch_attention():
    code = """
import torch
from kernels import cpu_linear, cpu_native
from actors.model.attention_backends import resolve_backend
assert not cpu_native.load() and "SPECRAY_CPU_KERNELS=0" in cpu_native.unavailable_reason()
assert resolve_backend("auto", "cpu") == "torch" and not cpu_linear.native()
assert cpu_linear.lone_row_doubled(torch.float32) == cpu_linear.ENABLED
try:
    resolve_backend("native", "cpu")
except ValueError as e:
    print("refused:", e)
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPECRAY_CPU_KERNELS": "0", "PYTHONPATH": str(ROOT)})
    assert "refused: attention backend 'native'" in res.stdout and "SPECRAY_CPU_KERNELS=0" in res.stdout, \
        res.stdout + res.stderr
