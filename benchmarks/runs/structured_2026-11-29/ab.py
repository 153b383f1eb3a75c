"""Structured output (response_format json_schema) at concurrency 1, greedy: a plain engine and a
default-draft engine (adaptive), each answering 12 prompts with and without the prompt's JSON schema,
taking turns (ABBA rounds, benchmarks.alternate); the baseline is plain constrained decoding
(spec_tokens 0: not even the grammar's forced tokens drafted). Prints tok/s, tokens a step and the
share of answers that parse and match their schema's keys.
Usage: PYTHONPATH=. python benchmarks/runs/structured_2026-11-29/ab.py ROUNDS"""
import json
import sys

import torch

from actors.sampling_params import SamplingParams
from actors.structured_output import StructuredOutput
from benchmarks.alternate import alternate, report
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}


def obj(**props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


CASES = [
    ("Describe a fictional person: name, age and city.", obj(name=S, age=I, city=S)),
    ("Give a product listing for a pair of running shoes.", obj(name=S, brand=S, price=N, sizes={"type": "array", "items": I})),
    ("Write a recipe card for pancakes.", obj(title=S, servings=I, ingredients={"type": "array", "items": S},
                                              steps={"type": "array", "items": S})),
    ("Describe an upcoming concert.", obj(artist=S, venue=S, date=S, ticket_price=N)),
    ("Give the details of a classic novel.", obj(title=S, author=S, year=I, genre=S)),
    ("Give a postal address in Paris.", obj(street=S, city=S, postal_code=S, country=S)),
    ("Report today's weather in Tokyo.", obj(city=S, temperature_c=N, condition={"enum": ["sunny", "cloudy", "rain", "snow"]},
                                            humidity=I)),
    ("Summarise an online order of three books.", obj(order_id=S, items={"type": "array", "items": obj(title=S, quantity=I)},
                                                      total=N)),
    ("Describe a science fiction movie.", obj(title=S, director=S, year=I, rating=N)),
    ("Create an employee record for a software engineer.", obj(name=S, title=S, department=S, salary=I, skills={
        "type": "array", "items": S})),
    ("Describe a family car.", obj(make=S, model=S, year=I, fuel={"enum": ["petrol", "diesel", "electric", "hybrid"]})),
    ("Give facts about the city of Rome.", obj(name=S, country=S, population=I, landmarks={"type": "array", "items": S})),
]
rounds = int(sys.argv[1])
msgs = [[{"role": "user", "content": f"{q} Answer in JSON."}] for q, _ in CASES]
free = [SamplingParams(max_tokens=160) for _ in CASES]
schema = [SamplingParams(max_tokens=160, structured=StructuredOutput(kind="json_schema", value=s)) for _, s in CASES]
no_jump = [p.model_copy(update={"spec_tokens": 0}) for p in schema]
engines = {"plain": LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg("none", 0))),
           "default": LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
               "default", 5, None, adaptive=True)))}


class WithParams:
    """An engine answering with this arm's params (the script's messages in order)."""

    def __init__(self, engine, params):
        self.engine, self.params, self.clock = engine, {id(m): p for m, p in zip(msgs, params)}, engine.clock

    def generate(self, prompts, plist, chat=True):
        return self.engine.generate(prompts, [self.params[id(m)] for m in prompts], chat=chat)


arms = {"plain-schema-spec0": WithParams(engines["plain"], no_jump),
        **{f"{e}-{k}": WithParams(engines[e], p) for e in engines for k, p in (("free", free), ("schema", schema))}}
runs = alternate(arms, msgs, free, rounds=rounds,
                 on_run=lambda r: print(f"round {r.round} {r.arm}: {r.tokens_per_s:.1f} tok/s, "
                                        f"{r.tokens_per_step:.2f} tokens/step", flush=True))
print(report(runs, baseline="plain-schema-spec0"))
tok = engines["plain"].prompts.tokenizer
for arm in arms:
    last = [r for r in runs if r.arm == arm][-1]
    ok = 0
    for ids, (_, s) in zip(last.token_ids, CASES):
        try:
            ok += list(json.loads(tok.decode(ids, skip_special_tokens=True))) == list(s["properties"])
        except (ValueError, TypeError):
            pass
    same = all(r.token_ids == last.token_ids for r in runs if r.arm == arm)
    print(f"{arm}: {ok}/{len(CASES)} answers parse with the schema's keys in order; identical every round: {same}")
