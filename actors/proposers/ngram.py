"""Prompt lookup (n-gram): propose what followed the longest earlier occurrence of the suffix."""
from __future__ import annotations

import numpy as np

from actors.proposers.base import DraftRequest, Proposer
from actors.tree import TokenTree, merge_trees, truncate_tree


class NgramProposer(Proposer):
    """Prompt lookup: find the longest suffix (``n_max`` down to ``n_min`` tokens) that occurred
    earlier in prompt + output and propose what followed it. Width > 1 at depth 1 proposes the
    continuations of several distinct earlier matches (most recent first).

    ``width`` > 1 (``--draft default``'s lookup): a lookup draft asks for ``width`` draft nodes per
    depth, as a dynamic tree does (within its cap), and fills them: each of up to ``width`` distinct
    continuations runs as far as the nodes allow (``max_nodes``, within ``max_depth``), merged and
    cut breadth-first. Where text is copied, ten tokens of one continuation are worth more than the
    head's ten-node tree; the head's nodes stay where lookup finds nothing.

    A request's ``prediction`` (OpenAI's predicted outputs: token ids the answer is expected to
    repeat) is searched as if it stood before the prompt, behind a separator no token matches: its
    continuations are drafted like the prompt's, and a draft never runs from it into the prompt."""

    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4, width: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if width < 1:
            raise ValueError(f"ngram width must be >= 1 (draft nodes per depth), got {width}")
        self.n_min, self.n_max, self.width = n_min, n_max, width
        self._occurrences: dict[int, _Occurrences] = {}  # seq_id -> where its tokens occur
        self._references: dict[int, tuple[tuple, np.ndarray]] = {}  # seq_id -> its prediction, as an array

    def nodes_per_depth(self, source: str | None) -> int:
        return self.width if source is not None and source.startswith(self.name) else 1

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        return [self._propose_one(r) for r in reqs]

    def _propose_one(self, req: DraftRequest) -> TokenTree:
        tokens = with_reference(req.token_ids, self._reference(req.seq_id, req.params.prediction_ids))
        depth = len(req.expansion)
        width = req.expansion[0] if req.expansion else 0
        if self.width > 1 and depth:  # fill the reserved nodes: farther, and up to `width` candidates
            depth, width = max(depth, min(req.max_nodes, req.depth_limit)), max(width, self.width)
        trees = [TokenTree.chain(int(tokens[-1]), c) for c in self._continuations(tokens, depth, width)]
        if not trees:
            return TokenTree.root(int(tokens[-1]))
        return truncate_tree(merge_trees(trees), req.max_nodes)

    def draft_source(self, token_ids: list[int], seq_id: int | None = None,
                     reference: tuple[int, ...] = ()) -> str | None:
        """``ngram<n>``, n the longest suffix match (None: none). With a ``reference`` (a request's
        prediction) ``ngram<n>p``, n the longest match in it or the history: such requests' drafts
        copy from a text given for the purpose, and the adaptive policy keeps their estimates apart."""
        n = self._history_match(token_ids, seq_id)
        if reference:  # the prediction, then the last n_max + 1 tokens (a longer match is the history's own)
            tail = token_ids[-self.n_max - 1:]
            n = max(n, self._longest_match(with_reference(tail, self._reference(seq_id, reference)))[0])
        return f"ngram{n}{'p' if reference else ''}" if n else None

    def _history_match(self, token_ids: list[int], seq_id: int | None) -> int:
        """The longest suffix match in the sequence's own tokens (0: none). With ``seq_id``, from
        where each of its tokens occurs (``_Occurrences``, kept until ``release``): asked every step
        for every decoding sequence, it then looks at the last token's earlier places only, not the
        whole history."""
        n = None
        if seq_id is not None:
            occ = self._occurrences.get(seq_id)
            if occ is None or occ.size > len(token_ids):
                occ = self._occurrences[seq_id] = _Occurrences()
            n = occ.longest_match(token_ids, self.n_min, self.n_max)
        if n is None:  # no sequence, or its last token is everywhere (a loop): one vectorised scan
            n, _ = self._longest_match(np.asarray(token_ids, dtype=np.int64))
        return n

    def _reference(self, seq_id: int | None, reference: tuple[int, ...]) -> np.ndarray | tuple:
        """``reference`` as an int64 array, converted once per sequence (an 8,000-token prediction
        took 0.12 ms to convert, asked every step)."""
        if not reference or seq_id is None:
            return reference
        kept = self._references.get(seq_id)
        if kept is None or kept[0] is not reference:
            kept = self._references[seq_id] = (reference, np.asarray(reference, dtype=np.int64))
        return kept[1]

    def release(self, seq_id: int) -> None:
        self._occurrences.pop(seq_id, None)
        self._references.pop(seq_id, None)

    def _longest_match(self, tokens: np.ndarray) -> tuple[int, np.ndarray]:
        """(n, starts): the longest suffix length in n_min..n_max that occurred earlier with a
        continuation, and where (ascending); (0, []) when none did. One pass over the history finds
        where the last token occurred before; longer suffixes only filter those places."""
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # earlier places of the last token
        found, found_ends = 0, ends[:0]
        for n in range(1, min(self.n_max, len(tokens) - 1) + 1):
            if n > 1:
                ends = ends[ends >= n - 1]
                ends = ends[tokens[ends - (n - 1)] == tokens[-n]]
            if not len(ends):
                break
            if n >= self.n_min:
                found, found_ends = n, ends
        return found, found_ends - (found - 1) if found else found_ends

    def _continuations(self, tokens: np.ndarray, depth: int, width: int) -> list[list[int]]:
        n, starts = self._longest_match(tokens)
        out: list[list[int]] = []
        for s in starts[::-1]:  # most recent match first
            cont = tokens[s + n: s + n + depth]
            cut = np.flatnonzero(cont < 0)  # a prediction's continuation ends at its separator
            cont = (cont[:cut[0]] if len(cut) else cont).tolist()
            if cont and cont not in out:
                out.append(cont)
            if len(out) >= width:
                break
        return out


def with_reference(token_ids: list[int], reference: tuple[int, ...] | np.ndarray) -> np.ndarray:
    """[len(reference) + 1 + len(token_ids)]: the reference, a separator (-1, no token's id), then
    the tokens; just the tokens without a reference."""
    if not len(reference):
        return np.asarray(token_ids, dtype=np.int64)
    return np.concatenate([np.asarray(reference, dtype=np.int64), [-1], np.asarray(token_ids, dtype=np.int64)])


MAX_PLACES = 64  # more earlier places of the last token than this: numpy's scan beats Python's filter


class _Occurrences:
    """Where each token of one sequence occurs (ascending), extended as the sequence grows: the
    longest suffix match then filters the last token's earlier places in Python, a few list items
    in the usual case, instead of converting and scanning the whole history every step."""

    __slots__ = ("at", "size")

    def __init__(self):
        self.at: dict[int, list[int]] = {}
        self.size = 0  # tokens indexed

    def longest_match(self, tokens: list[int], n_min: int, n_max: int) -> int | None:
        """``NgramProposer._longest_match``'s n for ``tokens`` (this sequence's, grown since the last
        call); None when the last token occurred more than ``MAX_PLACES`` times before."""
        at = self.at
        for i in range(self.size, len(tokens)):
            at.setdefault(tokens[i], []).append(i)
        self.size = size = len(tokens)
        ends = at[tokens[-1]][:-1] if size else []  # earlier places of the last token
        if len(ends) > MAX_PLACES:
            return None
        found = 0
        for n in range(1, min(n_max, size - 1) + 1):
            if n > 1:
                want = tokens[size - n]
                ends = [e for e in ends if e >= n - 1 and tokens[e - n + 1] == want]
            if not ends:
                break
            if n >= n_min:
                found = n
        return found
