"""Where a step's time goes at concurrency 1: every decode-only step of an engine, with its tokens,
draft nodes and the step clock's phases (cluster/step_clock.py), held-out prompts, chat template.

    PYTHONPATH=. python benchmarks/runs/t1_phases_2026-11-29/phases.py ab TEMP ROUNDS
        the plain engine and the default-draft engine (adaptive K<=5) alternated (ABBA) in one
        process: per pass, the steps that drafted nothing (wall ms and phases) and the drafted ones
    PYTHONPATH=. python benchmarks/runs/t1_phases_2026-11-29/phases.py pass TEMP
        one fresh default-draft engine, one pass: phases per step by draft nodes verified
"""
import sys
import time

import torch

from benchmarks.alternate import heldout_requests
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine


def engine(draft: bool) -> LLMEngine:
    spec = {"speculative": SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)} if draft else {}
    return LLMEngine(EngineConfig(device="cpu", num_threads=2, **spec))


def record_steps(eng: LLMEngine) -> list[dict]:
    """The list every later decode-only step of ``eng`` is appended to: wall seconds, phases (s),
    tokens produced, drafting sequences, draft nodes verified."""
    rows, current = [], {}
    measure, step = eng.drafting.measure, eng.step

    def measured(part, trees, computed, seconds):
        y = measure(part, trees, computed, seconds)
        current.update(drafted=y.drafted_seqs, tokens=y.drafted_tokens + y.plain_seqs, decode=y.decode_only,
                       nodes=sum(t.size - 1 for t in trees.values()))
        return y

    def timed_step():
        current.clear()
        before, t0 = eng.clock.snapshot(), time.perf_counter()
        out = step()
        after = eng.clock.snapshot()
        if current.get("decode"):
            rows.append({**current, "wall": time.perf_counter() - t0,
                         "phases": {k: after[k] - before[k] for k in after if k != "steps"}})
        return out

    eng.drafting.measure, eng.step = measured, timed_step
    return rows


def mean_ms(rows: list[dict], key) -> float:
    return 1e3 * sum(key(x) for x in rows) / max(len(rows), 1)


def phases_ms(rows: list[dict]) -> dict:
    return {k: round(mean_ms(rows, lambda x: x["phases"][k]), 2) for k in rows[0]["phases"]} if rows else {}


def answer(eng: LLMEngine, msgs, params) -> float:
    t0 = time.perf_counter()
    for m, p in zip(msgs, params):
        eng.generate([m], [p], chat=True)
    return time.perf_counter() - t0


def ab(temperature: float, rounds: int) -> None:
    msgs, params = heldout_requests(temperature=temperature)
    arms = {"plain": engine(False), "default": engine(True)}
    logs = {name: record_steps(eng) for name, eng in arms.items()}
    for r in range(rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            n0 = len(logs[name])
            wall = answer(arms[name], msgs, params)
            rows = logs[name][n0:]
            tokens = sum(x["tokens"] for x in rows)
            plain, drafted = [x for x in rows if not x["drafted"]], [x for x in rows if x["drafted"]]
            print(f"round {r} {name}: {tokens} tok {tokens / wall:.1f} tok/s; plain steps {len(plain)} "
                  f"{mean_ms(plain, lambda x: x['wall']):.2f} ms {phases_ms(plain)}; drafted steps {len(drafted)} "
                  f"{mean_ms(drafted, lambda x: x['wall']):.2f} ms "
                  f"{sum(x['tokens'] for x in drafted) / max(len(drafted), 1):.2f} tok", flush=True)


def one_pass(temperature: float) -> None:
    msgs, params = heldout_requests(temperature=temperature)
    eng = engine(True)
    rows = record_steps(eng)
    print(f"{answer(eng, msgs, params):.1f} s")
    for nodes in sorted({x["nodes"] for x in rows}):
        group = [x for x in rows if x["nodes"] == nodes]
        print(f"nodes {nodes} n {len(group)} tok/step {sum(x['tokens'] for x in group) / len(group):.2f} "
              f"ms {phases_ms(group)}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    if sys.argv[1] == "ab":
        ab(float(sys.argv[2]), int(sys.argv[3]))
    else:
        one_pass(float(sys.argv[2]))
