"""Where a default-draft engine's steps go at T=1.0 (seeded) next to a plain engine's, on the
held-out prompts at concurrency 1: host ms per step per phase (cluster/step_clock.py), tokens a
step, tok/s; the arms take turns (ABBA) so the machine's drift falls on both.
Usage: PYTHONPATH=. python benchmarks/runs/sampled_2026-11-29/phases.py ROUNDS [LIMIT [TEMP [unseeded]]]
(request i samples with seed 100 + i unless `unseeded`)"""
import sys

import torch

from benchmarks.alternate import heldout_requests, run_arm
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.step_clock import PHASES

torch.set_num_threads(2)
rounds = int(sys.argv[1])
limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
temperature = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
msgs, params = heldout_requests(temperature=temperature, limit=limit)
seeded = not (len(sys.argv) > 4 and sys.argv[4] == "unseeded")
params = [p.model_copy(update={"seed": 100 + i if seeded else None}) for i, p in enumerate(params)]
arms = {"plain": LLMEngine(EngineConfig(device="cpu", num_threads=2,
                                        speculative=SpeculativeConfig.from_draft_arg("none", 0))),
        "default": LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
            "default", 5, None, adaptive=True)))}
if "--off" in sys.argv:  # a third arm: the default engine whose policy never drafts (its overhead alone)
    off = arms["draft-off"] = LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
        "default", 5, None, adaptive=True)))
    off.spec_policy.choose = lambda slots, *a, **k: [0] * len(slots)
    off.spec_policy.reserve = lambda *a, **k: False
for e in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
tot = {a: {"steps": 0, "tokens": 0, "s": 0.0, **dict.fromkeys(PHASES, 0.0)} for a in arms}
for r in range(rounds):
    for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
        e = arms[name]
        before = e.clock.snapshot()
        tokens, steps, secs, _ = run_arm(e, msgs, params)
        after = e.clock.snapshot()
        t = tot[name]
        t["steps"] += steps
        t["tokens"] += tokens
        t["s"] += secs
        for p in PHASES:
            t[p] += after[p] - before[p]
        print(f"round {r} {name}: {tokens / secs:.1f} tok/s, {tokens / steps:.2f} tokens/step", flush=True)
print(f"{'arm':8s} {'tok/s':>6s} {'tok/step':>8s} {'ms/step':>7s} " + " ".join(f"{p[:7]:>7s}" for p in PHASES))
for name, t in tot.items():
    n = t["steps"]
    print(f"{name:8s} {t['tokens'] / t['s']:6.1f} {t['tokens'] / n:8.2f} {t['s'] / n * 1e3:7.2f} "
          + " ".join(f"{t[p] / n * 1e3:7.3f}" for p in PHASES))
pol = arms["default"].spec_policy
if pol is not None:
    print("policy sources:", {s: [round(x, 2) for x in e.global_rates()] for s, e in pol.acceptance.items()})
    print("verify table:", [(n, round(s * 1e3, 2)) for n, s in pol.verify_cost.points()])
    print("draft tables:", {s: [(n, round(x * 1e3, 3)) for n, x in c.points()] for s, c in pol.draft_cost_by_source.items()})
g = arms["default"].drafting.guard
print("guard: tripped", g.tripped, "trips", g.num_trips, "last speedup", g.last_speedup)
