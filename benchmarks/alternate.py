"""Engines taking turns on the same requests at concurrency 1: the A/B for noisy machines.

On the 2-core VM the same command moves 5-10% over minutes (and up to 2x between phases), so a
variant measured after another compares the machine's moods, not the variants. Here every arm is
an engine built once in this process; each round runs every arm over the same requests one at a
time, in reversed order every other round (ABBA), and the figures compared are per round:

    from benchmarks.alternate import alternate, heldout_requests, report
    msgs, params = heldout_requests(temperature=0.0)
    rounds = alternate({"plain": plain_engine, "new": new_engine}, msgs, params, rounds=4)
    print(report(rounds, baseline="plain"))

Scripts under ``benchmarks/runs/`` build their arms and call this instead of copying the loop.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArmRun:
    """One arm's pass over the requests in one round."""

    round: int
    arm: str
    tokens: int
    steps: int
    seconds: float
    token_ids: tuple[tuple[int, ...], ...]  # each request's output, in request order

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def heldout_requests(temperature: float = 0.0, limit: int | None = None, prompt_set: str = "heldout"):
    """(chat messages, SamplingParams) of a prompt set's requests, each with its own answer budget."""
    from actors.sampling_params import SamplingParams
    from benchmarks.options import PROMPT_SETS, select_prompts

    _, prompts = select_prompts(PROMPT_SETS.get(prompt_set, prompt_set), None, 0)
    prompts = prompts[:limit]
    return ([p.messages for p in prompts],
            [SamplingParams(max_tokens=p.budget(None), temperature=temperature) for p in prompts])


def run_arm(engine, msgs: list, params: list, chat: bool = True,
            clock=time.perf_counter) -> tuple[int, int, float, tuple]:
    """(tokens, engine steps, seconds, outputs) of ``engine`` answering the requests one at a time."""
    steps0, t0 = engine.clock.steps, clock()
    outs = [engine.generate([m], [p], chat=chat)[0] for m, p in zip(msgs, params)]
    seconds = clock() - t0
    ids = tuple(tuple(o.token_ids) for o in outs)
    return sum(len(i) for i in ids), engine.clock.steps - steps0, seconds, ids


def alternate(arms: Mapping[str, object], msgs: list, params: list, rounds: int, chat: bool = True,
              warmup: int = 2, on_run: Callable[[ArmRun], None] | None = print,
              clock=time.perf_counter) -> list[ArmRun]:
    """Every arm (name -> engine) over the same requests, ``rounds`` times, the arms' order reversed
    every other round, after a warm-up of ``warmup`` requests each. ``on_run`` sees each pass as it ends."""
    if rounds < 1 or not arms:
        raise ValueError(f"alternate: rounds={rounds} and {len(arms)} arms: need at least one of each")
    for engine in arms.values():
        if warmup:
            engine.generate(msgs[:warmup], params[:warmup], chat=chat)
    names, out = list(arms), []
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            tokens, steps, seconds, ids = run_arm(arms[name], msgs, params, chat, clock)
            out.append(ArmRun(r, name, tokens, steps, seconds, ids))
            if on_run is not None:
                on_run(out[-1])
    return out


def report(runs: list[ArmRun], baseline: str | None = None) -> str:
    """A Markdown table: per arm, tok/s of each round, their mean, tokens per step and, against
    ``baseline``, the ratio of mean tok/s and the rounds the arm was faster in."""
    arms = list(dict.fromkeys(r.arm for r in runs))
    if baseline is not None and baseline not in arms:
        raise ValueError(f"baseline {baseline!r} is not an arm ({', '.join(arms)})")
    by = {a: sorted((r for r in runs if r.arm == a), key=lambda r: r.round) for a in arms}
    mean = {a: sum(r.tokens_per_s for r in by[a]) / len(by[a]) for a in arms}
    lines = ["| arm | tok/s per round | mean tok/s | tokens/step | vs baseline |", "|---|---|---|---|---|"]
    for a in arms:
        per = ", ".join(f"{r.tokens_per_s:.1f}" for r in by[a])
        tps = sum(r.tokens for r in by[a]) / max(1, sum(r.steps for r in by[a]))
        vs = ""
        if baseline is not None and a != baseline:
            won = sum(x.tokens_per_s > b.tokens_per_s for x, b in zip(by[a], by[baseline]))
            vs = f"{mean[a] / mean[baseline]:.3f}x, faster in {won} of {min(len(by[a]), len(by[baseline]))}"
        lines.append(f"| {a} | {per} | {mean[a]:.1f} | {tps:.2f} | {vs} |")
    return "\n".join(lines)


def same_outputs(runs: list[ArmRun]) -> bool:
    """Whether every pass gave the same tokens (greedy speculation must)."""
    return len({r.token_ids for r in runs}) <= 1


class PhaseLog:
    """``on_run`` for engines with a step clock (``cluster.step_clock``): prints each pass with its
    ms per step in every clock phase since that engine's last pass. ``engine_of(arm)``: the engine
    whose clock an arm's pass advanced (several arms may share one)."""

    def __init__(self, engine_of: Callable[[str], object], phases: tuple[str, ...] = ("schedule", "draft", "forward")):
        self.engine_of, self.phases, self.last = engine_of, phases, {}

    def __call__(self, r: ArmRun) -> None:
        print(self.line(r), flush=True)

    def line(self, r: ArmRun) -> str:
        clock = self.engine_of(r.arm).clock
        now = clock.snapshot()
        before = self.last.get(id(clock), dict.fromkeys(now, 0.0))
        self.last[id(clock)] = now
        ms = ms_per_step(before, now)
        shown = ", ".join(f"{p} {ms[p]:.3f}" for p in self.phases)
        return (f"round {r.round} {r.arm}: {r.tokens} tokens, {r.tokens_per_s:.1f} tok/s, {r.tokens_per_step:.2f} "
                f"tokens/step, step {sum(ms.values()):.2f} ms ({shown} ms)")


def ms_per_step(before: dict, after: dict) -> dict[str, float]:
    """Milliseconds per step in each phase between two ``StepClock.snapshot()``s."""
    steps = after["steps"] - before["steps"]
    return {k: 1e3 * (after[k] - before[k]) / steps if steps else 0.0 for k in after if k != "steps"}
