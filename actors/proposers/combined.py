"""Proposers made of proposers: several trees merged into one (SpecInfer), or one proposer's tree
where it drafts anything and another's elsewhere (``--draft default``: lookup first, then the head)."""
from __future__ import annotations

from actors.proposers.base import DraftRequest, Proposer
from actors.tree import TokenTree, merge_trees, truncate_tree


class MergedProposer(Proposer):
    """Runs several proposers and merges their trees per request (SpecInfer's merge)."""

    name = "merged"

    def __init__(self, proposers: list[Proposer]):
        self.proposers = proposers

    def nodes_per_depth(self, source: str | None) -> int:
        return max(p.nodes_per_depth(source) for p in self.proposers)

    def sampled_siblings(self, source: str | None) -> int:
        return max(p.sampled_siblings(source) for p in self.proposers)

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        per = [p.propose(reqs) for p in self.proposers]
        self.catch_up_s = sum(p.catch_up_s for p in self.proposers)
        self.catch_up_entries = sum(p.catch_up_entries for p in self.proposers)
        return [truncate_tree(merge_trees([t[i] for t in per]), r.max_nodes) for i, r in enumerate(reqs)]

    def release(self, seq_id: int) -> None:
        for p in self.proposers:
            p.release(seq_id)


class FallbackProposer(Proposer):
    """``first``'s tree for each request where it drafted anything, ``second``'s for the others.

    ``--draft default`` is prompt lookup (a suffix of >= 2 tokens recurs: copying, loops, code
    edits) before the EAGLE head: lookup is right more often where it matches, and the head drafts
    where it does not. Features for a feature-reading ``second`` (EAGLE) are forwarded on every
    step, so it stays in sync while ``first`` drafts."""

    name = "fallback"

    def __init__(self, first: Proposer, second: Proposer):
        self.first, self.second = first, second
        self.needs_hidden = first.needs_hidden or second.needs_hidden
        self.num_first = self.num_second = 0  # requests drafted by each (read by tests)

    def draft_source(self, token_ids: list[int], seq_id: int | None = None,
                     reference: tuple[int, ...] = ()) -> str | None:
        src = self.first.draft_source(token_ids, seq_id, reference)
        return src if src is not None else self.second.draft_source(token_ids, seq_id, reference)

    def nodes_per_depth(self, source: str | None) -> int:
        return max(self.first.nodes_per_depth(source), self.second.nodes_per_depth(source))

    def sampled_siblings(self, source: str | None) -> int:
        return max(self.first.sampled_siblings(source), self.second.sampled_siblings(source))

    def observe(self, seq_id: int, start: int, features) -> None:
        for p in (self.first, self.second):
            if p.needs_hidden:
                p.observe(seq_id, start, features)

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        trees = self.first.propose(reqs)
        rest = [i for i, t in enumerate(trees) if t.num_draft_tokens == 0]
        self.catch_up_s, self.catch_up_entries = self.first.catch_up_s, self.first.catch_up_entries
        if rest:
            for i, tree in zip(rest, self.second.propose([reqs[i] for i in rest])):
                trees[i] = tree
            self.catch_up_s += self.second.catch_up_s
            self.catch_up_entries += self.second.catch_up_entries
        self.num_first += len(reqs) - len(rest)
        self.num_second += len(rest)
        return trees

    def release(self, seq_id: int) -> None:
        self.first.release(seq_id)
        self.second.release(seq_id)
