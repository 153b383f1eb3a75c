"""The Python before a forward, timed in a loop (argv[1] != 'op') and after a 100 MB fill each time
(argv[1] == 'op': the weights' stream of a step evicts the interpreter's caches). 2026-11-28 19:35."""
import time, statistics, torch, sys
from benchmarks.op_count import StepRunner
from cluster.config import EngineConfig
from cluster.engine import LLMEngine
from actors.verifier import build_forward_batch
torch.set_num_threads(2)
e = LLMEngine(EngineConfig(device="cpu"))
model = e.verifier.model; v = e.verifier
r = StepRunner(model, 1, 300, torch.device("cpu"))
from actors.tree import TokenTree
tree = TokenTree.root(5)
chunks = [r._chunk(0, tree.tokens, tree.positions(300), None)]
with_op = sys.argv[1] == "op"
T = {}
def lap(name, t):
    n = time.perf_counter(); T[name] = T.get(name, 0) + n - t; return n
big = torch.empty(100_000_000//4)
with torch.inference_mode():
  for it in range(300):
    if with_op: big.fill_(1.0)
    t = time.perf_counter()
    batch = build_forward_batch(chunks, v.block_size, v.device); t = lap("build_batch", t)
    x = model.embed_tokens(batch.input_ids); t = lap("embed", t)
    rope = model.rotary.halves_tables(batch.positions); t = lap("rope", t)
for k, val in T.items(): print(f"{k:24s} {1e3*val/300:.3f} ms")
