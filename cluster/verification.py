"""What one step's target logits decide for each sequence (the engine's verify phase,
cluster/engine.py): the tree a decoding sequence verified, the logits its request's processing asks
for, the argmax greedy requests read, and each tree's verdict: greedy longest match, the seeded race
(drafter-invariant) or multi-step speculative sampling (actors/spec_verify.py)."""
from __future__ import annotations

import torch

from actors.logits_processing import process_logits
from actors.sampling import greedy, params_probs
from actors.scheduler import ScheduledSeq
from actors.sequence import Sequence
from actors.spec_verify import verify_greedy, verify_keyed, verify_sampling_logits
from actors.structured_output import mask_logits
from actors.tree import TokenTree


def tree_of(seq: Sequence, trees: dict[int, TokenTree]) -> TokenTree:
    """The tree ``seq`` verifies this step: its draft, or its last token alone."""
    return trees.get(seq.seq_id) or TokenTree.root(seq.token_ids[-1])


def processed_logits(scheduled: list[ScheduledSeq], trees: dict[int, TokenTree], spans: list[tuple[int, int]],
                     logits: torch.Tensor, eos_ids) -> torch.Tensor:
    """logits [M, V] with each sequence's logits processing (penalties, bias, min_tokens, a grammar) applied to
    its rows (spans: per sequence, first row and row count), each tree node given its own path
    (actors.logits_processing); the same tensor when no sequence asks for any."""
    todo = [(s, span) for s, span in zip(scheduled, spans) if span[1] and s.seq.params.processes_logits]
    if not todo:
        return logits
    out = logits.to(torch.float32).clone()
    for s, (r0, nrows) in todo:
        seq = s.seq
        tree = tree_of(seq, trees) if s.is_decode else TokenTree.root(seq.token_ids[-1])
        if seq.params.penalizes:
            prompt = seq.token_ids[:seq.num_prompt_tokens]
            out[r0:r0 + nrows] = process_logits(logits[r0:r0 + nrows], seq.params, prompt, seq.output_ids,
                                                tree.parents, tree.tokens, eos_ids)
        if seq.grammar is not None:  # each node's row: what the grammar allows after its path
            mask_logits(out[r0:r0 + nrows], seq.grammar.forbidden(tree.parents, tree.tokens))
    return out


def step_argmax(scheduled: list[ScheduledSeq], logits: torch.Tensor) -> list[int] | None:
    """logits [M, V] -> every row's argmax, the step's one read-back (it waits for the device), when a
    greedy request reads it; None for a step of sampled requests alone (their first sample waits)."""
    return greedy(logits).tolist() if any(s.seq.params.greedy for s in scheduled) else None


def verify_tree(seq: Sequence, tree: TokenTree, rows: torch.Tensor, argmax: list[int] | None):
    """rows: [tree.size, V] target logits of the tree nodes; argmax: theirs (greedy requests)."""
    if seq.params.greedy:
        return verify_greedy(tree, argmax)
    p = seq.params
    if p.seed is None:  # multi-step speculative sampling, distributions formed only where the walk goes
        return verify_sampling_logits(tree, rows, p, seq.generator)
    probs = params_probs(rows, p)  # drafter-invariant: the seed fixes the output
    return verify_keyed(tree, probs, p.seed, root_position=seq.num_computed)
