"""Token-tree verification: every node of a tree, run in ONE forward (beside another sequence's decode),
has the logits of decoding that node's path sequentially; accepted nodes moved to their logical slots
with copy_kv_slots let decoding continue exactly."""
from __future__ import annotations

import torch

from actors.model.attention import copy_kv_slots
from actors.model.loader import load_model
from tests.model import Chunk, hf_logits, make_batch, random_ids, random_tables, slot_of

PARENTS = [-1, 0, 0, 1, 1, 2, 5, 3]  # root, two children, grandchildren, a depth-3 chain


def tree_depths(parents: list[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: node i sees node j iff j is i or an ancestor of i (parents precede children)."""
    t = len(parents)
    mask = torch.eye(t, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def path(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def test_tree_nodes_match_sequential_paths(tiny_model_dir):
    model_dir = tiny_model_dir("llama", tie_word_embeddings=False)
    model = load_model(model_dir).model
    bs, ctx = 4, 9
    prompt, other = random_ids(ctx, 256, 10), random_ids(6, 256, 11)
    tree_tokens = random_ids(len(PARENTS), 256, 12)
    table, table_b = random_tables(2, 6, 20, seed=13)
    kv = model.allocate_kv_cache(20, bs)
    depth = tree_depths(PARENTS)
    tree = Chunk(tree_tokens, ctx, table, positions=[ctx + d for d in depth], window=ancestor_mask(PARENTS))
    with torch.inference_mode():
        model(make_batch([Chunk(prompt, 0, table), Chunk(other[:5], 0, table_b)], bs), kv)
        logits = model.compute_logits(model(make_batch([Chunk(other[5:], 5, table_b), tree], bs), kv))
    torch.testing.assert_close(logits[0], hf_logits(model_dir, other)[-1], atol=1e-4, rtol=0)
    for node in range(len(PARENTS)):
        seq = prompt + [tree_tokens[i] for i in path(PARENTS, node)]
        torch.testing.assert_close(logits[1 + node], hf_logits(model_dir, seq)[-1], atol=1e-4, rtol=0,
                                   msg=lambda m: f"tree node {node}: {m}")

    # accept the path root -> 2 -> 5 -> 6: move its K/V to logical positions ctx.., then decode on
    accepted = path(PARENTS, 6)
    src = torch.tensor([slot_of(table, ctx + n, bs) for n in accepted])
    dst = torch.tensor([slot_of(table, ctx + d, bs) for d in range(len(accepted))])
    copy_kv_slots(kv, src, dst)
    nxt = random_ids(1, 256, 14)
    start = ctx + len(accepted)
    with torch.inference_mode():
        out = model.compute_logits(model(make_batch([Chunk(nxt, start, table)], bs), kv))
    seq = prompt + [tree_tokens[i] for i in accepted] + nxt
    torch.testing.assert_close(out[0], hf_logits(model_dir, seq)[-1], atol=1e-4, rtol=0)
