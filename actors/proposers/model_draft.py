"""Model proposers: draft a token tree level by level with a causal LM, batched across sequences.

- ``LayerSkipProposer``: the target's first N layers + its final norm and head (shared weights).
  It reuses the target's KV cache: committed positions hold exactly the K/V those layers produce,
  and the draft writes only the step's speculative slots, which verification then overwrites.
- ``DraftModelProposer``: a separate same-tokenizer model with its own paged cache and its own
  block allocator; it catches up on the tokens committed since its last step in its first forward.

One forward per tree depth: depth 0 runs the root (plus catch-up), depth d runs the nodes added at
depth d with the tree's ancestor mask, so every node sees exactly its path.
"""
from __future__ import annotations

import torch

from actors.kv_allocator import KVBlockAllocator
from actors.proposers.base import DraftRequest, Proposer
from actors.sampling import params_probs, race_top, sample_distinct
from actors.tree import TokenTree
from actors.verifier import SeqChunk, Verifier


class _Job:
    """Drafting state of one request: its tree, the frontier to expand, where its K/V go."""

    __slots__ = ("req", "tree", "frontier", "table", "ctx", "catch_up_from")

    def __init__(self, req: DraftRequest, table: list[int], catch_up_from: int):
        self.req = req
        self.tree = TokenTree.root(req.token_ids[-1])
        self.frontier = [0]
        self.table = table
        self.ctx = req.root_position  # the root's position; node j lives at position ctx + j
        self.catch_up_from = catch_up_from

    def slot(self, block_size: int, position: int) -> int:
        return self.table[position // block_size] * block_size + position % block_size


def _expand(job: _Job, depth: int, rows: torch.Tensor) -> None:
    """rows: [len(frontier), V] draft logits of the frontier nodes -> add the depth's children."""
    req, width = job.req, job.req.expansion[depth]
    new = []
    if req.params.greedy:
        top = rows.topk(width, dim=-1).indices.tolist()
        for parent, toks in zip(job.frontier, top):
            new += [job.tree.add(parent, int(t)) for t in toks]
    else:
        p = req.params
        probs = params_probs(rows.float(), p)
        for parent, q in zip(job.frontier, probs):
            if p.seed is None:  # distinct draws from q, each with the q it was drawn from (multi-step
                picks, proposals = sample_distinct(q, width, req.generator)  # speculative sampling)
                new += [job.tree.add(parent, int(t), r) for t, r in zip(picks, proposals)]
            else:  # seeded: the target will pick argmax(p / E) with this position's race; guess its top-width
                new += [job.tree.add(parent, int(t), q) for t in race_top(q, p.seed, job.ctx + depth + 1, width)]
    job.frontier = new


def draft_trees(runner: Verifier, jobs: list[_Job], num_layers: int | None) -> list[TokenTree]:
    """Grow every job's tree to its expansion depth; one batched forward per depth."""
    bs = runner.block_size
    for depth in range(max(len(j.req.expansion) for j in jobs)):
        live = [j for j in jobs if depth < len(j.req.expansion) and j.frontier]
        if not live:
            break
        chunks, rows, n = [], [], 0
        for j in live:
            chunk = _level_chunk(j, depth, bs)
            chunks.append(chunk)
            q = len(chunk.token_ids)
            rows += list(range(n + q - len(j.frontier), n + q))
            n += q
        logits = runner.forward_logits(chunks, rows, num_layers=num_layers)  # [sum frontier, V]
        start = 0
        for j in live:
            k = len(j.frontier)
            _expand(j, depth, logits[start:start + k])
            start += k
    return [j.tree for j in jobs]


def _level_chunk(job: _Job, depth: int, bs: int) -> SeqChunk:
    if depth == 0:  # catch-up tokens (draft model only) + the root, causal
        start = job.catch_up_from
        pos = list(range(start, job.ctx + 1))
        ids = job.req.token_ids[start: job.ctx + 1]
        return SeqChunk(ids, pos, [job.slot(bs, p) for p in pos], job.ctx + 1, job.table, None)
    tree, nodes = job.tree, job.frontier
    depths = tree.depths
    mask = tree.ancestor_mask()[nodes]  # [q, size]: each new node sees its ancestors and itself
    return SeqChunk(
        [tree.tokens[i] for i in nodes],
        [job.ctx + depths[i] for i in nodes],
        [job.slot(bs, job.ctx + i) for i in nodes],
        job.ctx + tree.size,
        job.table,
        mask,
    )


class LayerSkipProposer(Proposer):
    name = "layerskip"

    def __init__(self, verifier, num_layers: int):
        """verifier: the target's Verifier (or a TP shard group with the same interface)."""
        total = verifier.num_layers
        if not 1 <= num_layers < total:
            raise ValueError(f"layerskip:{num_layers}: N must be between 1 and {total - 1} "
                             f"(the target has {total} layers)")
        self.verifier = verifier
        self.num_layers = num_layers
        self.name = f"layerskip:{num_layers}"

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        jobs = [_Job(r, r.block_table, r.root_position) for r in reqs]
        return draft_trees(self.verifier, jobs, self.num_layers)


class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, runner: Verifier):
        self.runner = runner
        self.allocator = KVBlockAllocator(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.computed: dict[int, int] = {}  # seq_id -> positions whose draft K/V are valid

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        jobs, out = [], {}
        for r in reqs:
            job = self._job(r)
            if job is None:  # draft cache full: this sequence decodes plainly this step
                out[r.seq_id] = TokenTree.root(r.token_ids[-1])
            else:
                jobs.append(job)
        if jobs:
            for j, tree in zip(jobs, draft_trees(self.runner, jobs, None)):
                out[j.req.seq_id] = tree
                self.computed[j.req.seq_id] = j.ctx + 1
        return [out[r.seq_id] for r in reqs]

    def _job(self, r: DraftRequest) -> _Job | None:
        alloc, need = self.allocator, r.root_position + 1 + r.max_nodes
        if r.seq_id not in self.computed:
            if not alloc.can_allocate(r.token_ids, extra_tokens=r.max_nodes):
                return None
            alloc.allocate(r.seq_id, r.token_ids, extra_tokens=r.max_nodes)
            self.computed[r.seq_id] = 0
        elif alloc.can_append(r.seq_id, need):
            alloc.append(r.seq_id, need)
        else:
            self.release(r.seq_id)
            return None
        start = min(self.computed[r.seq_id], r.root_position)
        return _Job(r, alloc.block_table(r.seq_id), start)

    def release(self, seq_id: int) -> None:
        if seq_id in self.computed:
            del self.computed[seq_id]
            self.allocator.free(seq_id)
