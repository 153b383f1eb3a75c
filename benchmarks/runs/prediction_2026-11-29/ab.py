"""Predicted outputs (chat's `prediction`) on the held-out prompts, greedy, concurrency 1: a plain
engine, and one default-draft engine (adaptive, K<=5) taking turns between no prediction, a
prediction that is an earlier sampled answer to the same prompt (T=0.8, seed 1: another version of
the text), the greedy answer edited (4 of every 40 tokens replaced by other tokens of the answer:
a document with a few changes) and the exact greedy answer (the bound). ABBA rounds
(benchmarks.alternate).
Usage: PYTHONPATH=. python benchmarks/runs/prediction_2026-11-29/ab.py ROUNDS [TEMP [seeded]]
(TEMP: the requests' temperature, unseeded unless `seeded`: request i samples with seed 100 + i, so
every arm samples the same answers; the predictions stay the greedy and T=0.8 answers)"""
import sys

import torch

from benchmarks.alternate import alternate, heldout_requests, report
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.outputs import repeated_tokens

torch.set_num_threads(2)
rounds = int(sys.argv[1])
temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
seeded = len(sys.argv) > 3 and sys.argv[3] == "seeded"
msgs, params = heldout_requests(temperature=0.0)
plain = LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg("none", 0)))
eng = LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
    "default", 5, None, adaptive=True)))

exact = [o.text for o in plain.generate(msgs, params, chat=True)]
sampled = [o.text for o in plain.generate(msgs, [p.model_copy(update={"temperature": 0.8, "seed": 1})
                                                  for p in params], chat=True)]
tok = eng.prompts.tokenizer


def edited(text: str) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False)
    for at in range(20, len(ids) - 4, 40):  # 4 tokens of every 40 replaced by 4 from farther on
        ids[at:at + 4] = ids[(at + 97) % len(ids):][:4] or ids[:4]
    return ids


kept = [repeated_tokens(tok.encode(s, add_special_tokens=False), tok.encode(e, add_special_tokens=False))
        for s, e in zip(sampled, exact)]
print(f"sampled predictions: {sum(len(tok.encode(s)) for s in sampled)} tokens, {sum(kept)} of them in order in the "
      f"greedy answers ({sum(len(tok.encode(e)) for e in exact)} tokens)")


class Predicting:
    """The default engine, each request given this arm's prediction (None: none)."""

    def __init__(self, predictions):
        self.by_msg = {id(m): p for m, p in zip(msgs, predictions)}
        self.clock = eng.clock

    def generate(self, prompts, plist, chat=True):
        plist = [p.model_copy(update={"prediction": self.by_msg.get(id(m))}) for m, p in zip(prompts, plist)]
        return eng.generate(prompts, plist, chat=chat)


params = [p.model_copy(update={"temperature": temperature, "seed": 100 + i if seeded else None})
          for i, p in enumerate(params)]
arms = {"plain": plain, "default": Predicting([None] * len(msgs)), "sampled-prediction": Predicting(sampled),
        "edited-prediction": Predicting([tuple(edited(e)) for e in exact]), "exact-prediction": Predicting(exact)}
runs = alternate(arms, msgs, params, rounds=rounds,
                 on_run=lambda r: print(f"round {r.round} {r.arm}: {r.tokens_per_s:.1f} tok/s, "
                                        f"{r.tokens_per_step:.2f} tokens/step", flush=True))
same = {a: all(r.token_ids == runs[0].token_ids for r in runs if r.arm == a) for a in arms}
print(report(runs, baseline="plain"))
print("identical outputs per arm (greedy or seeded: must be):", same)
