"""The benchmark sweep: every method x speculation shape x temperature x concurrency, the
no-speculation baseline always first and always in the same run (speedups compare like with like).

A backend (in-process engines or an HTTP endpoint) opens one *session* per group of variants that
can share an engine (so a model or engine is built once per group, never per run); the session's
runner serves the whole prompt set once and returns a ``Run``.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from benchmarks.options import DEFAULT_MAX_K
from benchmarks.prompt_set import BenchPrompt
from benchmarks.results import BASELINE, Run, Variant

RunOnce = Callable[[Variant, list[BenchPrompt], int, float], Run]  # variant, prompts, concurrency, temperature


def request_seed(seed: int | None, index: int, temperature: float) -> int | None:
    """The sampling seed of the ``index``-th prompt: ``seed + index`` for sampled requests (every
    variant then emits the same tokens: seeded sampling is drafter-invariant), none for greedy ones
    or when ``seed`` is None (``--unseeded``: fresh randomness, as most API clients send)."""
    return seed + index if seed is not None and temperature > 0 else None


class Backend(Protocol):
    def session(self, method: str, variants: tuple[Variant, ...],
                warmup_prompt: BenchPrompt) -> AbstractContextManager[RunOnce]: ...


@dataclass(frozen=True, slots=True)
class Group:
    """Variants of one method that one engine serves (chains up to max K, or one tree)."""

    method: str
    variants: tuple[Variant, ...]


def grows_trees(method: str) -> bool:
    """Methods whose draft can grow dynamic trees (an EAGLE head)."""
    from cluster.config import is_eagle_draft

    return is_eagle_draft(method)


def plan_groups(methods: list[str], spec_tokens: list[int], tree: str | None = None,
                adaptive: bool = False, tree_widths: tuple[int, ...] | None = None,
                tree_nodes: tuple[int | None, ...] | None = None, default_width: int | None = None) -> list[Group]:
    """adaptive: one more variant per method, the engine's adaptive depth up to max(spec_tokens);
    tree_widths: for EAGLE methods, one group per width (1 = chains; None: the engine's default
    width); tree_nodes: for widths > 1, one group per cap on a tree's draft nodes (None: the
    engine's default cap with the default width, else width x K); default_width: the engine's
    default width on the device the runs use (``cluster.config.default_tree_width``; None: a GPU's)."""
    from cluster.config import DEFAULT_TREE_NODES, DEFAULT_TREE_WIDTH

    widths = (default_width or DEFAULT_TREE_WIDTH,) if tree_widths is None else tree_widths
    caps = tree_nodes or ((DEFAULT_TREE_NODES,) if tree_widths is None else (None,))
    groups = [Group(BASELINE, (Variant(),))]
    for m in methods:
        if m == BASELINE:
            continue
        shapes = [(w, n) for w in (widths if grows_trees(m) else (1,)) for n in (caps if w > 1 else (None,))]
        for w, n in shapes:
            variants = [Variant(spec_tokens=k, tree_width=w, tree_nodes=n) for k in spec_tokens]
            if adaptive:
                variants.append(Variant(spec_tokens=max(spec_tokens, default=DEFAULT_MAX_K), adaptive=True,
                                        tree_width=w, tree_nodes=n))
            groups.append(Group(m, tuple(variants)))
        if tree:
            groups.append(Group(m, (Variant(tree=tree),)))
    return groups


def iter_runs(backend: Backend, groups: list[Group], prompts: list[BenchPrompt], temperatures: list[float],
              concurrencies: list[int]) -> Iterator[Run]:
    for g in groups:
        with backend.session(g.method, g.variants, prompts[0]) as run_once:
            for v in g.variants:
                for t in temperatures:
                    for c in concurrencies:
                        run = run_once(v, prompts, c, t)
                        toks = sum(r.output_tokens for r in run.records)
                        print(f"# {g.method} {v.label} T={t:g} c={c}: {toks / run.wall_s:.2f} tok/s "
                              f"({toks} tokens, {run.wall_s:.1f} s)", file=sys.stderr, flush=True)
                        yield run
