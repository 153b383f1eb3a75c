# one-off, 2026-11-28 session K (see benchmarks/ARCHIVE.md, 23:00 entry); phase.py loaded an instrumented copy of kernels/csrc from /tmp/s/prof, the prototype of benchmarks.step_phases
import sys, time, statistics, torch
from torch.utils import cpp_extension
torch.set_num_threads(2)
from kernels import cpu_native
SRC = "/tmp/s/prof"
import os
os.makedirs("/tmp/s/prof_build", exist_ok=True)
cpp_extension.load(name="specray_prof_x", sources=[f"{SRC}/{s}" for s in cpu_native.SOURCES],
    extra_cflags=[*cpu_native.CFLAGS, "-DSPECRAY_NS=specray_prof"], extra_ldflags=["-fopenmp"],
    extra_include_paths=[SRC], build_directory="/tmp/s/prof_build", is_python_module=False)
P = torch.ops.specray_prof
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from benchmarks.op_count import StepRunner
model = load_model("smollm2-135m", device=torch.device("cpu")).model
set_attention_backend(model, "auto", torch.device("cpu"))
orig = cpu_native.decoder_layers
acc = {"dl": 0.0, "lin": 0.0}
def dl(*a, **k):
    t = time.perf_counter(); r = P.decoder_layers(*a, **k); acc["dl"] += time.perf_counter() - t; return r
cpu_native.decoder_layers = dl
lin0 = cpu_native.linear
def lin(*a, **k):
    t = time.perf_counter(); r = lin0(*a, **k); acc["lin"] += time.perf_counter() - t; return r
cpu_native.linear = lin
kind = sys.argv[1] if len(sys.argv) > 1 else "decode"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
seg = int(sys.argv[3]) if len(sys.argv) > 3 else 512
P.set_attention_segment(seg)
B = int(sys.argv[4]) if len(sys.argv) > 4 else 1
r = StepRunner(model, B, 300, torch.device("cpu"))
run = r.step(kind)
for _ in range(20): run()
P.phase_times(); acc.update(dl=0.0, lin=0.0)
t0 = time.perf_counter()
for _ in range(n): run()
w = (time.perf_counter() - t0) / n * 1e3
ph = P.phase_times() / n * 1e3
names = ["norm_in", "qkv", "rope", "attn", "o", "norm_post", "gate_up", "silu", "down"]
print(kind, f"wall {w:.3f} ms/step; decoder_layers {acc['dl']/n*1e3:.3f}; lm head linear {acc['lin']/n*1e3:.3f}")
print("  " + ", ".join(f"{a} {b:.3f}" for a, b in zip(names, ph.tolist())), f"sum {ph[:9].sum():.3f}")
