"""Tests for actors.tree: construction, masks, expansion configs, merge and truncation."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.tree import (
    MAX_TREE_NODES,
    TokenTree,
    expansion_num_nodes,
    merge_trees,
    parse_expansion,
    truncate_tree,
)

# --------------------------------------------------------------------------- helpers


def _q(vocab: int = 4) -> torch.Tensor:
    """A fresh proposal tensor (a distinct object, so identity shows which node it came from)."""
    return torch.full((vocab,), 1.0 / vocab)


def token_path(tree: TokenTree, i: int) -> tuple[int, ...]:
    return tuple(tree.tokens[j] for j in tree.path_to(i))


def brute_ancestors(tree: TokenTree, i: int) -> set[int]:
    out = {i}
    while tree.parents[i] >= 0:
        i = tree.parents[i]
        out.add(i)
    return out


@st.composite
def random_trees(draw, max_nodes: int = 16, vocab: int = 3, root: int | None = None, sampled: bool = True):
    n = draw(st.integers(1, max_nodes))
    tree = TokenTree.root(draw(st.integers(0, vocab - 1)) if root is None else root)
    for i in range(1, n):
        q = _q(vocab) if sampled and draw(st.booleans()) else None
        tree.add(draw(st.integers(0, i - 1)), draw(st.integers(0, vocab - 1)), q)
    return tree


def _example() -> TokenTree:
    """root 9 ─┬─ 1 (n1) ── 2 (n3) ── 4 (n5)
               └─ 3 (n2) ── 5 (n4)"""
    tree = TokenTree.root(9)
    n1, n2 = tree.add(0, 1), tree.add(0, 3)
    n3, n4 = tree.add(n1, 2), tree.add(n2, 5)
    tree.add(n3, 4)
    return tree


# --------------------------------------------------------------------------- construction and structure


def test_root_and_chain():
    tree = TokenTree.root(7)
    assert (tree.size, tree.num_draft_tokens, tree.max_depth) == (1, 0, 0)
    assert tree.ancestor_mask().tolist() == [[True]]
    q = torch.softmax(torch.randn(3, 5), -1)
    chain = TokenTree.chain(7, [1, 2, 3], draft_probs=q)
    assert chain.tokens == [7, 1, 2, 3] and chain.parents == [-1, 0, 1, 2]
    assert chain.draft_probs[0] is None and all(torch.equal(chain.draft_probs[i + 1], q[i]) for i in range(3))
    assert chain.depths == [0, 1, 2, 3] and chain.max_depth == 3 and chain.num_draft_tokens == 3
    assert torch.equal(chain.ancestor_mask(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert TokenTree.chain(7, [1, 2]).draft_probs == [None, None, None]
    with pytest.raises(ValueError, match="3 tokens got 2"):
        TokenTree.chain(7, [1, 2, 3], draft_probs=q[:2])


def test_structure_of_a_branching_tree():
    tree = _example()
    assert tree.children(0) == [1, 2] and tree.children(1) == [3] and tree.children(5) == []
    assert tree.child_lists() == [[1, 2], [3], [4], [5], [], []]
    assert tree.depths == [0, 1, 1, 2, 2, 3]
    assert tree.path_to(5) == [0, 1, 3, 5] and tree.path_to(0) == [0]
    assert tree.positions(10) == [10, 11, 11, 12, 12, 13]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 0, 1, 0, 1, 0],
            [1, 1, 0, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_mask(), expected)


@pytest.mark.parametrize(
    "tokens, parents, probs, fragment",
    [
        ([], [], [], "non-empty"),
        ([1, 2], [-1], [None, None], "equal"),
        ([1, 2], [0, 0], [None, None], "parents\\[0\\] must be -1"),
        ([1, 2, 3], [-1, 0, 2], [None, None, None], "parents\\[2\\] = 2"),
        ([1, 2], [-1, 5], [None, None], "parents\\[1\\] = 5"),
    ],
)
def test_invalid_trees_are_rejected(tokens, parents, probs, fragment):
    with pytest.raises(ValueError, match=fragment):
        TokenTree(tokens, parents, probs)


def test_add_validates_parent_and_q():
    tree = TokenTree.root(0)
    with pytest.raises(ValueError, match="parent 3"):
        tree.add(3, 1)
    with pytest.raises(ValueError, match=r"\[V\] vector"):
        tree.add(0, 1, torch.ones(2, 2))
    assert tree.add(0, 1, _q()) == 1


@settings(max_examples=150, deadline=None)
@given(random_trees(max_nodes=20))
def test_structure_properties(tree):
    mask = tree.ancestor_mask()
    depths = tree.depths
    for i in range(tree.size):
        ancestors = brute_ancestors(tree, i)
        assert set(mask[i].nonzero().flatten().tolist()) == ancestors
        assert tree.path_to(i) == sorted(ancestors) and tree.path_to(i)[0] == 0
        assert depths[i] == len(ancestors) - 1
        assert tree.children(i) == [j for j in range(tree.size) if tree.parents[j] == i]
    assert mask.sum().item() == sum(d + 1 for d in depths)
    assert tree.max_depth == max(depths)
    assert tree.positions(5) == [5 + d for d in depths]


# --------------------------------------------------------------------------- expansion configs


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,1,3,1,1", [1, 1, 3, 1, 1]),
        (" 2, 2 ", [2, 2]),
        ("<1,1,3,1,1,1,1,1>", [1, 1, 3, 1, 1, 1, 1, 1]),
        ("[4]", [4]),
        ([1, 2, 3], [1, 2, 3]),
        ((np.int64(2), 3), [2, 3]),
    ],
)
def test_parse_expansion_good(text, expected):
    assert parse_expansion(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("<>", "empty"),
        ([], "empty"),
        ("1,x,3", "'x' is not an integer"),
        ("1,,3", "'' is not an integer"),
        ("1,2.5", "'2.5' is not an integer"),
        ("1,0,3", "branching 0 at depth 2"),
        ("2,-1", "branching -1 at depth 2"),
        ([1, 2.0], "2.0 is not an integer"),
        ([1, True], "True is not an integer"),
        ("8,8", f"72 draft nodes, over the limit of {MAX_TREE_NODES}"),
        ("1," * 65 + "1", f"66 draft nodes, over the limit of {MAX_TREE_NODES}"),
    ],
)
def test_parse_expansion_bad_names_the_value(text, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")) as err:
        parse_expansion(text)
    assert repr(text) in str(err.value)  # and the config itself is quoted


@pytest.mark.parametrize(
    "expansion, nodes",
    [([1], 1), ([1, 1, 3, 1, 1], 11), ([2, 2], 6), ([3, 1, 2], 3 + 3 + 6), ([1] * 5, 5), ([4, 4, 3], 4 + 16 + 48)],
)
def test_expansion_num_nodes(expansion, nodes):
    assert expansion_num_nodes(expansion) == nodes


def test_expansion_limit_is_inclusive():
    assert expansion_num_nodes(parse_expansion([1] * MAX_TREE_NODES)) == MAX_TREE_NODES
    with pytest.raises(ValueError, match=f"{MAX_TREE_NODES + 1} draft nodes"):
        parse_expansion([1] * (MAX_TREE_NODES + 1))


# --------------------------------------------------------------------------- merge


def test_merge_is_the_union_of_paths_and_dedups_deterministic_nodes():
    a = TokenTree.chain(9, [1, 2, 3])
    b = TokenTree.chain(9, [1, 2, 4])
    c = _example()  # 9 -> 1 -> 2 -> 4 and 9 -> 3 -> 5
    merged = merge_trees([a, b, c])
    paths = {token_path(merged, i) for i in range(merged.size)}
    assert paths == {(9,), (9, 1), (9, 1, 2), (9, 1, 2, 3), (9, 1, 2, 4), (9, 3), (9, 3, 5)}
    assert merged.size == len(paths)  # every shared deterministic prefix became one node
    assert merged.tokens == [9, 1, 2, 3, 4, 3, 5]
    assert merged.parents == [-1, 0, 1, 2, 2, 0, 5]


def test_merge_keeps_sampled_duplicates_apart():
    q1, q2 = _q(), _q()
    a = TokenTree.chain(9, [1, 2], draft_probs=[q1, q1])
    b = TokenTree.chain(9, [1, 2], draft_probs=[q2, q2])
    c = TokenTree.chain(9, [1, 2])  # deterministic: does not fold into a sampled node either
    merged = merge_trees([a, b, c])
    assert merged.tokens == [9, 1, 2, 1, 2, 1, 2]
    assert merged.parents == [-1, 0, 1, 0, 3, 0, 5]
    assert [p is q1 for p in merged.draft_probs] == [False, True, True, False, False, False, False]
    assert [p is q2 for p in merged.draft_probs] == [False, False, False, True, True, False, False]
    assert merged.draft_probs[5:] == [None, None]


def test_merge_attaches_sampled_subtrees_under_a_shared_deterministic_node():
    q = _q()
    a = TokenTree.chain(9, [1, 2])
    b = TokenTree.chain(9, [1, 2], draft_probs=[None, q])  # deterministic 1, then sampled 2
    merged = merge_trees([a, b])
    assert merged.tokens == [9, 1, 2, 2] and merged.parents == [-1, 0, 1, 1]
    assert merged.draft_probs[2] is None and merged.draft_probs[3] is q


def test_merge_rejects_different_roots_and_empty_input():
    with pytest.raises(ValueError, match="different roots \\(9 and 8\\)"):
        merge_trees([TokenTree.chain(9, [1]), TokenTree.chain(8, [1])])
    with pytest.raises(ValueError, match="at least one"):
        merge_trees([])


def _num_sampled(tree: TokenTree) -> int:
    return sum(q is not None for q in tree.draft_probs)


@settings(max_examples=150, deadline=None)
@given(st.lists(random_trees(max_nodes=10, root=0), min_size=1, max_size=4))
def test_merge_properties(trees):
    merged = merge_trees(trees)
    # topological, valid (the constructor checks parents[i] < i; rebuild to be sure)
    TokenTree(list(merged.tokens), list(merged.parents), list(merged.draft_probs))
    # union of paths
    paths = lambda t: {token_path(t, i) for i in range(t.size)}  # noqa: E731
    assert paths(merged) == set().union(*(paths(t) for t in trees))
    # every sampled proposal survives as its own node, never shared
    assert _num_sampled(merged) == sum(_num_sampled(t) for t in trees)
    ids = [id(q) for q in merged.draft_probs if q is not None]
    assert sorted(ids) == sorted(id(q) for t in trees for q in t.draft_probs if q is not None)
    # no two deterministic siblings share a token
    kids = merged.child_lists()
    for siblings in kids:
        det = [merged.tokens[c] for c in siblings if merged.draft_probs[c] is None]
        assert len(det) == len(set(det))
    assert merged.size <= 1 + sum(t.num_draft_tokens for t in trees)


@settings(max_examples=80, deadline=None)
@given(random_trees(max_nodes=12, sampled=False))
def test_merge_of_deterministic_tree_with_itself_is_idempotent(tree):
    once = merge_trees([tree])
    assert merge_trees([once, once]).tokens == once.tokens
    assert merge_trees([once, once]).parents == once.parents
    assert merge_trees([once]).tokens == once.tokens


# --------------------------------------------------------------------------- truncate


def test_truncate_keeps_breadth_first_prefix():
    tree = _example()  # BFS order of drafts: n1, n2, n3, n4, n5
    assert truncate_tree(tree, 10) is tree
    assert truncate_tree(tree, 5) is tree
    cut = truncate_tree(tree, 3)
    assert cut.tokens == [9, 1, 3, 2] and cut.parents == [-1, 0, 0, 1]
    assert truncate_tree(tree, 0).tokens == [9]
    with pytest.raises(ValueError, match="max_nodes must be >= 0 \\(got -1\\)"):
        truncate_tree(tree, -1)


def _bfs(tree: TokenTree) -> list[int]:
    order, queue = [], deque([0])
    while queue:
        i = queue.popleft()
        order.append(i)
        queue.extend(j for j in range(tree.size) if tree.parents[j] == i)
    return order[1:]


@settings(max_examples=150, deadline=None)
@given(random_trees(max_nodes=20), st.integers(0, 25))
def test_truncate_properties(tree, max_nodes):
    cut = truncate_tree(tree, max_nodes)
    assert cut.num_draft_tokens == min(max_nodes, tree.num_draft_tokens)
    kept = sorted(_bfs(tree)[:max_nodes])
    # the result is exactly the sub-tree induced by the first max_nodes nodes in BFS order
    assert cut.tokens == [tree.tokens[0]] + [tree.tokens[i] for i in kept]
    assert all(cut.draft_probs[k + 1] is tree.draft_probs[i] for k, i in enumerate(kept))
    index = {0: 0, **{i: k + 1 for k, i in enumerate(kept)}}
    assert all(tree.parents[i] in index for i in kept)  # prefix-closed
    assert cut.parents == [-1] + [index[tree.parents[i]] for i in kept]
