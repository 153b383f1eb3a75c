"""T=1.0 unseeded, held-out c=1, the default draft (adaptive, guard off): for each step, what the
policy predicted (tokens, seconds of draft + verify) against what the step gave; plain steps alike."""
import sys, time, torch
import numpy as np
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.spec_guard import FallbackGuardConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
temp = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=temp) for p in prompts]
spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
spec = spec.model_copy(update={"fallback_guard": FallbackGuardConfig(enabled=False)})
e = LLMEngine(EngineConfig(device="cpu", speculative=spec))
d, pol = e.drafting, e.drafting.policy
PRED = {}
import actors.spec_policy as sp
orig_cd = sp.choose_depths
def cd(gains, max_depths, base_tokens, verify_s, draft_round_s, **kw):
    depths, rate = orig_cd(gains, max_depths, base_tokens, verify_s, draft_round_s, **kw)
    w = kw.get("widths"); caps = kw.get("node_caps"); extra = kw.get("extra_nodes")
    dd = int(depths[0])
    nodes = int(sp.draft_node_counts(dd, int(w[0]) if w is not None else 1, int(extra[0]) if extra is not None else 0, int(caps[0]) if caps is not None else 10**9))
    t = verify_s(base_tokens + nodes) + dd * draft_round_s(1) if dd else verify_s(base_tokens)
    tok = 1 + float(gains[0, :dd].sum())
    PRED[pol.num_steps] = (dd, tok, t, 1 / max(verify_s(base_tokens), 1e-9))
    return depths, rate
sp.choose_depths = cd
ROWS = []
om = d.measure
def measure(part, trees, computed, seconds):
    y = om(part, trees, computed, seconds)
    s = part[0]
    if len(part) == 1 and s.is_decode:
        tree = trees.get(s.seq.seq_id)
        got = s.seq.num_computed - computed[s.seq.seq_id]
        pr = PRED.pop(pol.num_steps, None)
        ROWS.append((0 if tree is None else tree.max_depth, got, seconds, pr, e.clock.snapshot()))
    return y
d.measure = measure
e.generate(msgs[:2], params[:2], chat=True)
for rep in range(2):
    ROWS.clear()
    for m, p in zip(msgs, params):
        e.generate([m], [p], chat=True)
    for dep in sorted(set(r[0] for r in ROWS)):
        rs = [r for r in ROWS if r[0] == dep]
        withp = [r for r in rs if r[3] is not None and r[3][0] == dep]
        line = f"T={temp} rep {rep} depth {dep}: steps {len(rs)} tokens/step {np.mean([r[1] for r in rs]):.2f} s/step(draft+verify) {1e3*np.mean([r[2] for r in rs]):.2f} ms"
        if withp:
            line += f" | predicted tokens {np.mean([r[3][1] for r in withp]):.2f} s {1e3*np.mean([r[3][2] for r in withp]):.2f} ms (n={len(withp)})"
        print(line, flush=True)
