"""How prompt-lookup variants would draft on a recorded ``--draft default`` greedy run, without the target.

    python -m benchmarks.lookup_replay record [--prompts bench500,heldout] [--sample 24] [--threads 1]
                                              [--draft default-chain] --out DIR
    python -m benchmarks.lookup_replay score DIR

``record`` runs ``--draft default`` or ``default-chain`` (K=5, the engine's 10-node dynamic tree,
greedy, c=1, one engine per set) over a stratified sample and at every drafting step also asks the
EAGLE head for its tree, whoever drafts: DIR/<set>.json holds each prompt's category and prompt +
output token ids, and per step the context length and the head's tree. ``score`` replays each
variant at those steps: its tree (the head's where lookup finds nothing), how much of it the
target's greedy output accepts, and the draft nodes it verifies. Tokens per step = 1 + accepted,
which for the variant that made the run is its mean accepted length. The steps are the recorded
run's: a variant that accepts more would take fewer, larger steps, so this ranks variants
cheaply; ``specray bench`` measures them.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from actors.proposers.base import DraftRequest
from actors.proposers.ngram import NgramProposer
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree, merge_trees, truncate_tree

K, NODES = 5, 10  # the recorded run's chain depth and the dynamic tree's node cap


def record(prompts: list, threads: int | None, draft: str = "default") -> dict:
    """One ``--draft {draft}`` greedy run over ``prompts`` (BenchPrompts, c=1) with the head's tree
    recorded at every drafting step."""
    import dataclasses

    from benchmarks.engine_bench import EngineBackend
    from benchmarks.results import Variant

    backend = EngineBackend("smollm2-135m", None, engine_options={"num_threads": threads})
    engine = backend.engine(backend.config(draft, (Variant(spec_tokens=K, tree_width=3, tree_nodes=NODES),)))
    fallback, steps, contexts = engine.proposer, [], {}

    def recording(reqs: list[DraftRequest]):
        """The head drafts for every request (once per step: it consumes its pending features),
        with its own budget where lookup drafts; lookup's tree wins where it has one."""
        looked = fallback.first.propose(reqs)
        heads = fallback.second.propose([r if t.size == 1 else dataclasses.replace(r, max_nodes=NODES)
                                         for r, t in zip(reqs, looked)])
        for r, h in zip(reqs, heads):
            steps.append([r.seq_id, len(r.token_ids), h.tokens, h.parents])
            contexts[r.seq_id] = list(r.token_ids)
        return [t if t.size > 1 else h for t, h in zip(looked, heads)]

    fallback.propose = recording
    params = [SamplingParams(max_tokens=p.budget(None), spec_tokens=K) for p in prompts]
    outs = engine.generate([p.prompt for p in prompts], params, chat=True, concurrency=1)
    order = list(dict.fromkeys(s[0] for s in steps))  # c=1: sequences draft in prompt order
    if len(order) != len(prompts):
        raise RuntimeError(f"{len(order)} of {len(prompts)} prompts drafted; record needs every one to draft")
    index = {sid: i for i, sid in enumerate(order)}
    rows = [{"category": p.category, "num_prompt": o.num_prompt_tokens,
             "tokens": contexts[sid][:o.num_prompt_tokens] + list(o.token_ids)}
            for p, o, sid in zip(prompts, outs, order)]
    return {"prompts": rows, "steps": [[index[sid], n, toks, parents] for sid, n, toks, parents in steps]}


def accepted(tree: TokenTree, future: list[int]) -> int:
    """Draft tokens of ``tree`` that greedy verification keeps when the target goes on with ``future``."""
    kids, node, n = tree.child_lists(), 0, 0
    for tok in future:
        node = next((c for c in kids[node] if tree.tokens[c] == tok), None)
        if node is None:
            return n
        n += 1
    return n


def lookup_first(ngram: NgramProposer, merge_head: bool = False):
    """The variant ``ngram`` first, the head where it finds nothing (``merge_head``: the lookup
    tree kept whole and the head's likeliest nodes added, NODES in all, at the head's cost)."""
    def draft(tokens: list[int], head: TokenTree) -> tuple[TokenTree, bool]:
        if ngram.draft_source(tokens) is None:
            return head, True
        width = ngram.nodes_per_depth(ngram.draft_source(tokens))
        req = DraftRequest(0, tokens, [1] * K, min(width * K, NODES) if width > 1 else K, SamplingParams(), None, [],
                           max_depth=NODES)
        tree = ngram.propose([req])[0]
        if not merge_head:
            return tree, False
        return merge_trees([tree, truncate_tree(head, NODES - tree.num_draft_tokens)]), True
    return draft


VARIANTS = {
    "head alone": lambda tokens, head: (head, True),
    "lookup 2-4, K-chain (default-chain, the default before)": lookup_first(NgramProposer(2, 4)),
    "lookup 2-16, K-chain": lookup_first(NgramProposer(2, 16)),
    "lookup 2-4, fills 2 nodes/depth": lookup_first(NgramProposer(2, 4, width=2)),
    "lookup 2-16, fills 2 nodes/depth (default)": lookup_first(NgramProposer(2, 16, width=2)),
    "lookup 2-16, fills 3 nodes/depth": lookup_first(NgramProposer(2, 16, width=3)),
    "lookup 2-16 K-chain merged with the head's tree": lookup_first(NgramProposer(2, 16), merge_head=True),
}


def score(rec: dict, variants: dict = VARIANTS) -> dict[str, dict[str, list[float]]]:
    """variant -> category (and "all") -> [steps, accepted, draft nodes, steps the head drafted or ran]."""
    out = {name: defaultdict(lambda: [0, 0, 0, 0]) for name in variants}
    for i, n, toks, parents in rec["steps"]:
        prompt = rec["prompts"][i]
        tokens, future = prompt["tokens"][:n], prompt["tokens"][n:n + NODES]
        head = TokenTree(list(toks), list(parents), [None] * len(toks))
        for name, draft in variants.items():
            tree, head_ran = draft(tokens, head)
            for group in (prompt["category"], "all"):
                row = out[name][group]
                row[0] += 1
                row[1] += accepted(tree, future)
                row[2] += tree.num_draft_tokens
                row[3] += head_ran
    return out


def table(label: str, scores: dict) -> str:
    cats = sorted(c for c in next(iter(scores.values())) if c != "all") + ["all"]
    lines = [f"| {label}: variant | " + " | ".join(cats) + " | draft nodes per step | head ran |",
             "|---|" + "---|" * (len(cats) + 2)]
    for name, groups in scores.items():
        steps, acc, nodes, head = groups["all"]
        lines.append(f"| {name} | " + " | ".join(f"{1 + groups[c][1] / groups[c][0]:.2f}" for c in cats)
                     + f" | {nodes / steps:.2f} | {head / steps:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lookup_replay", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--prompts", default="bench500,heldout")
    r.add_argument("--sample", type=int, default=24)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--draft", default="default", choices=("default", "default-chain"))
    r.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("dir")
    args = p.parse_args(argv)
    if args.cmd == "record":
        from benchmarks.options import select_prompt_sets

        Path(args.out).mkdir(parents=True, exist_ok=True)
        for label, _, items in select_prompt_sets(args.prompts, args.sample, args.seed):
            (Path(args.out) / f"{label}.json").write_text(json.dumps(record(items, args.threads, args.draft)))
        return 0
    for f in sorted(Path(args.dir).glob("*.json")):
        scores = score(json.loads(f.read_text()))
        print(f"tokens per step (1 + accepted) at the recorded steps of {f.stem}\n\n{table(f.stem, scores)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
