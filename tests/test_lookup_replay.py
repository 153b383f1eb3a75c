"""benchmarks.lookup_replay scores lookup variants on a recorded run without the target."""
from __future__ import annotations

from actors.tree import TokenTree
from benchmarks.lookup_replay import VARIANTS, accepted, score, table


def test_accepted_walks_the_tree_along_the_targets_tokens():
    tree = TokenTree([9, 1, 2, 3, 4], [-1, 0, 0, 2, 3], [None] * 5)  # 9 -> 1 | 9 -> 2 -> 3 -> 4
    assert accepted(tree, [2, 3, 5]) == 2 and accepted(tree, [1, 7]) == 1 and accepted(tree, [8]) == 0
    assert accepted(tree, [2, 3, 4, 6]) == 3


def test_score_replays_lookup_and_falls_back_to_the_recorded_head():
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    rec = {"prompts": [{"category": "copy", "num_prompt": 13, "tokens": text}],
           "steps": [[0, 15, [6, 99], [-1, 0]],  # "5 6" recurs: lookup drafts 7 8 ...
                     [0, 3, [7, 8], [-1, 0]]]}  # nothing recurs yet: the head's tree (8: right)
    s = score(rec)
    before = s["lookup 2-4, K-chain (default-chain, the default before)"]["all"]
    filled = s["lookup 2-16, fills 2 nodes/depth (default)"]["all"]
    assert before[:3] == [2, 5 + 1, 5 + 1] and before[3] == 1
    assert filled[:3] == [2, 10 + 1, 10 + 1]  # the copy goes on past K, within the 10 nodes
    assert s["head alone"]["all"][:2] == [2, 1]
    assert set(s) == set(VARIANTS) and "| copy | all |" in table("t", s)
