"""A target forward (B=1, 300 tokens of context, one row, native CPU path) timed after different
work between calls, arms alternated in one process (ABBA over rounds). Question: does a forward
that follows a gap of single-threaded work (what a drafted step's Python and bookkeeping are) run
slower than one that follows the previous forward at once (plain decoding)?
Usage: PYTHONPATH=. python gap_penalty.py THREADS [ROUNDS] [REPS]
Arms: none (back to back); busyX (the main thread spins X ms in Python, the torch worker waits);
parbusy2 (2 ms of tiny two-thread exp ops: both threads work). The gap itself is not timed."""
import sys
import time

import torch

import benchmarks.op_count as oc
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from actors.tree import TokenTree
from benchmarks.step_phases import step_phases

threads = int(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 60
torch.set_num_threads(threads)
cpu = torch.device("cpu")
model = load_model("smollm2-135m", device=cpu).model
set_attention_backend(model, "auto", cpu)
runner = oc.StepRunner(model, 1, 300, cpu)
tree = TokenTree.root(5)
chunks = [runner._chunk(0, tree.tokens, tree.positions(300), None)]
small, small_out = torch.rand(2 ** 16), torch.empty(2 ** 16)


def busy(ms: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        pass


def parbusy(ms: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        torch.exp(small, out=small_out)


ARMS = {"none": (lambda: None, 0.0), "busy0.5": (lambda: busy(0.5), 0.5), "busy1": (lambda: busy(1.0), 1.0),
        "busy2": (lambda: busy(2.0), 2.0), "parbusy2": (lambda: parbusy(2.0), 2.0)}


def arm(gap):
    def run():
        gap()
        runner.verifier.forward_logits(chunks, [0])
    return run


order = list(ARMS)
print(f"threads {threads}, {reps} forwards an arm a round; ms per forward (gap excluded): wall, decoder layers op, LM head")
totals = {a: [] for a in ARMS}
for rnd in range(rounds):
    for name in (order if rnd % 2 == 0 else order[::-1]):
        gap, gap_ms = ARMS[name]
        ms = step_phases(arm(gap), reps)
        wall = ms["wall"] - gap_ms  # the gap loop overshoots by well under a microsecond
        totals[name].append(wall)
        print(f"round {rnd} {name:9s} {wall:6.2f} {ms['layers']:6.2f} {ms['lm_head']:6.2f}", flush=True)
base = sum(totals["none"]) / rounds
for name, v in totals.items():
    mean = sum(v) / rounds
    print(f"mean {name:9s} {mean:6.2f} ms  ({mean - base:+.2f} vs none)")
