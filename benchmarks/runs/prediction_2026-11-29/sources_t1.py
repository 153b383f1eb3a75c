"""What a default-draft engine drafts at T=1.0 (unseeded) on the held-out prompts, with and without the
greedy answers as predictions: per draft source, drafted steps, draft tokens a step, accepted a step.
Usage: PYTHONPATH=. python benchmarks/runs/prediction_2026-11-29/sources_t1.py"""
import collections
import time

import torch

from benchmarks.alternate import heldout_requests
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
msgs, params = heldout_requests(temperature=0.0)
eng = LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
    "default", 5, None, adaptive=True)))
greedy = [o.text for o in eng.generate(msgs, params, chat=True)]
log = []
record = eng.drafting.record


def logged(seq, tree, num_accepted):
    log.append((eng.drafting.source(seq), tree.num_draft_tokens, tree.max_depth, num_accepted))
    record(seq, tree, num_accepted)


eng.drafting.record = logged
for label, preds in (("no prediction", [None] * len(msgs)), ("greedy answer as prediction", greedy)) * 2:
    log.clear()
    t0, steps0 = time.perf_counter(), eng.clock.steps
    outs = [eng.generate([m], [p.model_copy(update={"temperature": 1.0, "prediction": x})], chat=True)[0]
            for m, p, x in zip(msgs, params, preds)]
    secs, steps, toks = time.perf_counter() - t0, eng.clock.steps - steps0, sum(o.num_output_tokens for o in outs)
    print(f"\n{label}: {toks} tokens, {steps} steps, {toks / secs:.1f} tok/s, {secs / steps * 1e3:.2f} ms a step")
    by = collections.defaultdict(list)
    for src, n, depth, acc in log:
        by["p" if src and src.endswith("p") else (src or "none")[:5]].append((n, depth, acc))
    for src, rows in sorted(by.items()):
        k = len(rows)
        print(f"  {src:6s} drafted steps {k:5d}  draft tokens/step {sum(r[0] for r in rows) / k:.2f}  "
              f"depth {sum(r[1] for r in rows) / k:.2f}  accepted/step {sum(r[2] for r in rows) / k:.2f}")
