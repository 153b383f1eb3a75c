"""The target's final-normed hidden states of the positions a step commits.

A forward computes one hidden row per token of each sequence's chunk: every row of a prefill chunk
is committed, of a decode step's token tree only the root and the accepted path. ``committed_rows``
finds those rows; an EAGLE head reads them every step (cluster/drafting.py), and a request with
``return_hidden_states`` (SGLang's name) keeps them in a ``HiddenRecord``: the features a draft
head is trained on, taken from the generating engine's own forwards instead of a second,
teacher-forced pass over prompt and answer (training/data.py).
"""
from __future__ import annotations

import torch

from actors.tree import TokenTree


def committed_rows(tree: TokenTree | None, token_ids: list[int], n0: int, n1: int) -> list[int]:
    """The chunk rows of positions ``n0 .. n1 - 1``, committed this step, of a sequence whose tokens
    are now ``token_ids``: rows 0 .. n1 - n0 - 1 of a prefill chunk, a plain decode step or a chain;
    of a tree, the root and the children along the committed tokens (equal-token siblings share a
    path, so their hidden states are equal). Positions past the sequence's last token (a stop inside
    the accepted path) have no row."""
    if tree is None or n1 - n0 <= 1:
        return list(range(n1 - n0))
    kids, rows = tree.child_lists(), [0]
    for tok in token_ids[n0 + 1: n1]:
        rows.append(next(c for c in kids[rows[-1]] if tree.tokens[c] == tok))
    return rows


def take_rows(hidden: torch.Tensor, start: int, rows: list[int]) -> torch.Tensor:
    """hidden [N, H] -> [len(rows), H]: rows ``start + r``; consecutive rows as a view, not an index op."""
    if rows[-1] - rows[0] == len(rows) - 1:
        return hidden[start + rows[0]: start + rows[-1] + 1]
    return hidden[start + torch.tensor(rows, device=hidden.device)]


def committed_features(part, chunks, trees: dict[int, TokenTree], computed: dict[int, int], hidden: torch.Tensor,
                       finished: bool = False):
    """Yield (sequence, first position, rows [n, H]) of what each of ``part``'s sequences (the step's
    ScheduledSeqs, ``chunks`` their SeqChunks in order) committed this step. computed: seq_id ->
    num_computed before the step; hidden: [N, H] of the step's tokens in ``chunks`` order. Finished
    sequences only with ``finished`` (an EAGLE head has released them; a recording request wants
    the step that ended it)."""
    start = 0
    for s, chunk in zip(part, chunks):
        seq, n0 = s.seq, computed[s.seq.seq_id]
        if (finished or not seq.is_finished) and seq.num_computed > n0:
            rows = committed_rows(trees.get(seq.seq_id) if s.is_decode else None, seq.token_ids, n0, seq.num_computed)
            yield seq, n0, take_rows(hidden, start, rows)
        start += len(chunk.token_ids)


def record_hidden_states(part, chunks, trees: dict[int, TokenTree], computed: dict[int, int],
                         hidden: torch.Tensor) -> None:
    """Add what this step committed to the record of each of ``part``'s requests with
    ``return_hidden_states`` (arguments as ``committed_features``), the step that finished one included."""
    for seq, n0, rows in committed_features(part, chunks, trees, computed, hidden, finished=True):
        if seq.hidden_states is not None:
            seq.hidden_states.add(n0, rows)


class HiddenRecord:
    """One request's hidden states by position, as its steps commit them. A preemption that
    recomputes writes the same positions again: the later rows win (they are the ones its
    remaining tokens were generated from)."""

    __slots__ = ("parts",)

    def __init__(self):
        self.parts: list[tuple[int, torch.Tensor]] = []  # (first position, rows [n, H]) in commit order

    def add(self, start: int, rows: torch.Tensor) -> None:
        """rows [n, H]: positions start .. start + n - 1 (copied: the step's tensor is not kept)."""
        self.parts.append((start, rows.clone()))

    def gather(self, num_positions: int) -> torch.Tensor:
        """[num_positions, H] on the CPU: positions 0 .. num_positions - 1, each its latest row.
        Raises if one was never committed (a bug: every computed position is recorded)."""
        if not self.parts:
            raise RuntimeError("no hidden states were recorded")
        out = torch.empty(num_positions, self.parts[0][1].shape[1], dtype=self.parts[0][1].dtype)
        covered = torch.zeros(num_positions, dtype=torch.bool)
        for start, rows in self.parts:
            n = min(len(rows), num_positions - start)
            if n > 0:
                out[start:start + n] = rows[:n].cpu()
                covered[start:start + n] = True
        if not bool(covered.all()):
            missing = (~covered).nonzero().flatten()[:5].tolist()
            raise RuntimeError(f"hidden states of positions {missing} were never recorded")
        return out
