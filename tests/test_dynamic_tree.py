"""Dynamic draft trees (actors/proposers/dynamic_tree.py, EagleProposer with tree_width > 1): the pool keeps
the best-scoring, ancestor-closed nodes; trees stay within width x depth nodes; every candidate
is scored by what the head predicts after its own path; output stays the target's
(greedy and seeded sampling, fixed and adaptive depths, lookup first); the policy pays for width."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from actors.proposers.dynamic_tree import DraftPool
from actors.sampling_params import SamplingParams
from actors.spec_policy import choose_depths
from tests.tiny import TINY_MAX_TOKENS, random_eagle_head, tiny_engine


# ---- the pool (pure) ------------------------------------------------------------------------------

def _pool() -> DraftPool:
    """root -> a (0.6), b (0.3); a -> c (0.5), d (0.4); b -> e (0.9); c -> f (0.9)."""
    p = DraftPool(root_token=7)
    a, b = p.add(-1, 10, math.log(0.6)), p.add(-1, 11, math.log(0.3))
    c, d = p.add(a, 12, math.log(0.5)), p.add(a, 13, math.log(0.4))
    p.add(b, 14, math.log(0.9))
    p.add(c, 15, math.log(0.9))
    return p


def test_path_scores_and_depths():
    p = _pool()
    assert p.depths == [1, 1, 2, 2, 2, 3]
    assert np.allclose(np.exp(p.scores), [0.6, 0.3, 0.3, 0.24, 0.27, 0.27])
    assert p.best([2, 3, 4], 2) == [2, 4]  # c (0.30) and e (0.27) beat d (0.24)


@pytest.mark.parametrize("n, tokens", [(0, [7]), (1, [7, 10]), (3, [7, 10, 11, 12]),
                                       (5, [7, 10, 11, 12, 14, 15]), (99, [7, 10, 11, 12, 14, 13, 15])])
def test_to_tree_keeps_the_best_n_with_their_ancestors(n, tokens):
    tree = _pool().to_tree(n)
    assert tree.tokens == tokens
    assert tree.num_draft_tokens == min(n, 6)
    assert all(tree.parents[i] < i for i in range(1, tree.size))
    assert tree.depths == sorted(tree.depths)


def test_a_tie_never_orphans_a_node():
    """A child as likely as its parent (p = 1.0 in float) ranks after it: the parent is kept first."""
    p = DraftPool(root_token=0)
    a = p.add(-1, 1, 0.0)
    p.add(a, 2, 0.0)
    p.add(-1, 3, math.log(0.5))
    assert p.to_tree(1).tokens == [0, 1]
    assert p.to_tree(2).tokens == [0, 1, 2]


def test_a_score_floor_keeps_only_nodes_that_pay_for_their_row():
    """Candidates whose path probability is under the floor are left out, at any n; the set stays
    ancestor-closed; with no candidate at the floor the tree is the root alone; the frontier too."""
    p = _pool()  # path probabilities: a 0.6, b 0.3, c 0.3, d 0.24, e 0.27, f 0.27
    assert p.to_tree(99, math.log(0.28)).tokens == [7, 10, 11, 12]
    assert p.to_tree(1, math.log(0.28)).tokens == [7, 10]  # the cap still holds
    assert p.to_tree(99, math.log(0.25)).tokens == [7, 10, 11, 12, 14, 15]  # d (0.24) left out
    assert p.to_tree(99, math.log(0.7)).tokens == [7]
    assert p.best([2, 3, 4], 3, math.log(0.25)) == [2, 4]


# ---- the policy pays for each depth's width ---------------------------------------------------------

def test_the_node_floor_is_a_rows_cost_times_the_goodput():
    """A node must be expected to yield what its row costs at the step's rate: (seconds one more
    verified token adds) x (tokens per second the policy expects); 0 until measured, at most 0.5."""
    from actors.spec_policy import SpecPolicy

    pol = SpecPolicy(max_depth=4)
    assert pol.node_floor(1, 1) == 0.0
    for n, s in ((1, 0.010), (5, 0.012), (9, 0.014)):  # 0.5 ms a token
        pol.observe_verify(n, s)
    pol.last_goodput = 200.0  # tokens/s
    assert pol.node_floor(1, 1) == pytest.approx(0.0005 * 200.0)
    pol.last_goodput = 5000.0
    assert pol.node_floor(1, 1) == 0.5

def test_wider_drafts_cost_more_tokens_to_verify():
    gains = np.array([[0.6, 0.4, 0.2]])
    verify = lambda n: 0.01 + 0.003 * (n - 1)  # noqa: E731  a draft token costs 0.3 of a step
    draft = lambda b: 0.0  # noqa: E731
    chain, _ = choose_depths(gains, np.array([3]), 1, verify, draft)
    wide, _ = choose_depths(gains, np.array([3]), 1, verify, draft, widths=np.array([4]))
    assert chain[0] == 2 and wide[0] == 0  # 1.6 tokens for 2.2 steps' cost does not pay
    flat = lambda n: 0.01 + 1e-5 * n  # noqa: E731  verification nearly free (few rows on CPU)
    assert choose_depths(gains, np.array([3]), 1, flat, draft, widths=np.array([4]))[0][0] == 3


def test_a_node_cap_is_what_a_wide_tree_costs():
    """A width-4 tree capped at 2 nodes verifies 2 tokens whatever its depth: the chain's cost of
    depth 2, so the policy takes it (and goes deeper, the extra depths verifying nothing more)."""
    gains = np.array([[0.6, 0.5, 0.1]])
    verify = lambda n: 0.01 + 0.003 * (n - 1)  # noqa: E731
    draft = lambda b: 0.0  # noqa: E731
    depths, rate = choose_depths(gains, np.array([3]), 1, verify, draft, widths=np.array([4]),
                                 node_caps=np.array([2]))
    assert depths[0] == 3 and rate == pytest.approx((1 + 1.2) / verify(3))
    costly = lambda b: 0.0015  # noqa: E731  each depth a draft round: 2.1 tokens / 19 ms beat 2.2 / 20.5 ms
    assert choose_depths(gains, np.array([3]), 1, verify, costly, widths=np.array([4]),
                         node_caps=np.array([2]))[0][0] == 2


def test_first_depth_siblings_are_paid_once():
    """A chain with 3 draws at its first depth verifies d + 2 nodes at depth d >= 1 (nothing at 0):
    the policy charges the two extra nodes to any draft, and still drafts where they pay."""
    from actors.spec_policy import DecodeSlot

    slot = DecodeSlot(1, 4, siblings=3)
    assert [slot.nodes_at(d) for d in range(5)] == [0, 3, 4, 5, 6]
    assert DecodeSlot(1, 4, siblings=3, node_cap=5).nodes_at(4) == 5
    gains = np.array([[0.5, 0.2, 0.05]])
    verify = lambda n: 0.01 + 0.003 * (n - 1)  # noqa: E731
    draft = lambda b: 0.0  # noqa: E731
    assert choose_depths(gains, np.array([3]), 1, verify, draft)[0][0] == 1  # 1.5 tokens for 1.3 steps
    assert choose_depths(gains, np.array([3]), 1, verify, draft, extra_nodes=np.array([2]))[0][0] == 0  # 1.9 steps
    flat = lambda n: 0.01 + 1e-5 * n  # noqa: E731
    depths, rate = choose_depths(gains, np.array([3]), 1, flat, draft, extra_nodes=np.array([2]))
    assert depths[0] == 3 and rate == pytest.approx(1.75 / flat(6))


# ---- the proposer on a tiny target ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_head(tiny_target_dir, tmp_path_factory):
    from actors.model.loader import load_model

    return random_eagle_head(load_model(tiny_target_dir).model, 128, tmp_path_factory.mktemp("h") / "h.safetensors",
                             seed=2)


@pytest.fixture(scope="module")
def attentive_head(tiny_head, tmp_path_factory):
    """The random head with sharp attention and a strong attention output, so that what a node
    attends to moves its prediction well beyond bf16 rounding."""
    from actors.eagle.head import load_head

    head = load_head(tiny_head)
    with torch.no_grad():
        head.qkv.weight.mul_(4)
        head.o.weight.mul_(8)
    path = tmp_path_factory.mktemp("h") / "attentive.safetensors"
    head.save(path)
    return path


def _record_trees(proposer) -> list:
    """(request, tree) of every proposal; the request's token_ids copied (the sequence grows on)."""
    seen = []
    propose = proposer.propose

    def recording(reqs):
        trees = propose(reqs)
        seen.extend((dataclasses.replace(r, token_ids=list(r.token_ids)), t) for r, t in zip(reqs, trees))
        return trees

    proposer.propose = recording
    return seen


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("lookup_first", [False, True])
def test_greedy_trees_are_lossless_and_bounded(adaptive, lookup_first, tiny_target_dir, tiny_head, tiny_prompts,
                                               tiny_baseline):
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=3, adaptive=adaptive,
                      lookup_first=lookup_first, max_num_batched_tokens=32)
    head = eng.proposer.second if lookup_first else eng.proposer
    seen = _record_trees(head)
    outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=3)
    assert [o.token_ids for o in outs] == tiny_baseline
    trees = [t for _, t in seen if t.num_draft_tokens]
    assert trees, "the head never drafted"
    assert all(t.num_draft_tokens <= 3 * len(r.expansion) and t.max_depth <= len(r.expansion) for r, t in seen)
    if not adaptive:  # the full budget, 3 x 3 nodes, spent on the likeliest (a random head: shallow, wide)
        assert max(t.num_draft_tokens for t in trees) == 9 and max(t.max_depth for t in trees) >= 2
        assert max(t.depths.count(1) for t in trees) == 3
    assert not head.states


def test_the_policys_node_floor_prunes_head_trees_losslessly(tiny_target_dir, tiny_head, tiny_prompts, tiny_baseline):
    """Every draft request carries the policy's floor; a higher floor verifies fewer nodes per tree,
    one that no node reaches (1.0) leaves every tree at its root; the output is the target's whatever
    the floor."""
    nodes = {}
    for floor in (0.0, 0.02, 1.0):
        eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=3, adaptive=True,
                          max_num_batched_tokens=32)
        eng.drafting.policy.node_floor = lambda *a, floor=floor, **k: floor
        seen = _record_trees(eng.proposer)
        outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=3)
        assert [o.token_ids for o in outs] == tiny_baseline
        assert seen and all(r.min_node_prob == floor for r, _ in seen)
        nodes[floor] = sum(t.num_draft_tokens for _, t in seen) / len(seen)
    assert nodes[0.0] > nodes[0.02] > 0 and nodes[1.0] == 0, nodes


@pytest.mark.parametrize("lookup_width", [1, 2])
def test_lookup_first_fills_the_trees_budget_losslessly(lookup_width, tiny_target_dir, tiny_head, tiny_prompts,
                                                        tiny_baseline):
    """``--draft default``'s lookup asks for lookup_width nodes per depth, as the head's tree does, and
    continues its match that far (deeper than K), never past the request's room; width 1: K-chains."""
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=3, lookup_first=True,
                      max_num_batched_tokens=32)
    assert (eng.proposer.first.n_min, eng.proposer.first.n_max, eng.proposer.first.width) == (2, 16, 2)
    eng.proposer.first.width = lookup_width
    seen = _record_trees(eng.proposer.first)
    outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=3)
    assert [o.token_ids for o in outs] == tiny_baseline
    drafted = [(r, t) for r, t in seen if t.num_draft_tokens]
    assert drafted, "lookup never drafted"
    assert all(t.num_draft_tokens <= r.max_nodes and t.max_depth <= r.depth_limit for r, t in drafted)
    assert all(r.max_nodes == lookup_width * len(r.expansion) for r, _ in drafted)
    deepest = max(t.max_depth for _, t in drafted)
    assert deepest > 3 if lookup_width > 1 else deepest == 3
    assert any(r.depth_limit < 2 * len(r.expansion) for r, _ in seen), "no request near its max_tokens"


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_node_cap_bounds_trees_and_keeps_them_lossless(adaptive, tiny_target_dir, tiny_head, tiny_prompts,
                                                         tiny_baseline):
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=4, tree_width=3, tree_nodes=5,
                      adaptive=adaptive, max_num_batched_tokens=32)
    assert eng.config.speculative.max_nodes == 5
    seen = _record_trees(eng.proposer)
    outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=3)
    assert [o.token_ids for o in outs] == tiny_baseline
    trees = [t for _, t in seen if t.num_draft_tokens]
    assert trees and all(t.num_draft_tokens <= 5 and r.max_nodes <= 5 for r, t in seen)
    if not adaptive:
        assert max(t.num_draft_tokens for t in trees) == 5


def test_seeded_sampling_gives_plain_decodings_tokens(tiny_target_dir, tiny_head, tiny_prompts):
    params = [SamplingParams(max_tokens=TINY_MAX_TOKENS, temperature=0.8, seed=11 + i, ignore_eos=True)
              for i in range(4)]
    plain = tiny_engine(tiny_target_dir).generate(tiny_prompts[:4], params)
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=2)
    seen = _record_trees(eng.proposer)
    assert [o.token_ids for o in eng.generate(tiny_prompts[:4], params)] == [o.token_ids for o in plain]
    assert max(t.num_draft_tokens for _, t in seen) > 3, "seeded requests should get trees"


@pytest.mark.parametrize("tree_width, tree_nodes, sampled, siblings",
                         [(3, None, 3, 3), (3, 4, 3, 2), (1, None, None, 1), (3, None, 2, 2), (3, None, None, 1)])
def test_unseeded_sampling_drafts_chains_with_distinct_first_siblings(tree_width, tree_nodes, sampled, siblings,
                                                                      tiny_target_dir, tiny_head, tiny_prompts):
    """Multi-step speculative sampling needs draws from q, not top-w trees: an unseeded sampled
    request gets a chain whose first depth holds up to ``sampled_siblings`` distinct draws (within
    the node cap; unset on the CPU's native kernels: one), each recorded with the q it was drawn
    from (q without the earlier siblings)."""
    from kernels import cpu_native

    if sampled is None and tree_width > 1 and not cpu_native.load():
        pytest.skip("the CPU default (one draw) needs the native kernels")
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=tree_width, tree_nodes=tree_nodes,
                      sampled_siblings=sampled, adaptive=False)
    seen = _record_trees(eng.proposer)
    eng.generate(tiny_prompts[:2], SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True))
    drafted = [(r, t) for r, t in seen if t.num_draft_tokens]
    assert drafted
    for r, t in drafted:
        # the scheduler reserves (the policy charges) the chain plus its siblings, not a tree
        assert r.expansion == [siblings, 1, 1][: len(r.expansion)] and r.max_nodes == len(r.expansion) + siblings - 1
        first = [i for i in range(1, t.size) if t.parents[i] == 0]
        assert 1 <= len(first) <= siblings and len({t.tokens[i] for i in first}) == len(first)
        assert all(t.parents[i] in (0, first[0]) or t.parents[i] > first[0] for i in range(1, t.size))
        assert t.num_draft_tokens - len(first) == t.max_depth - 1  # one chain below the first sibling
        q = t.draft_probs[first[0]]  # over the head's draft vocabulary: q.probs [S] at token ids q.ids
        for k, node in enumerate(first):
            qk = t.draft_probs[node]
            assert torch.equal(qk.ids, q.ids)
            expected = q.probs.clone()
            expected[torch.isin(q.ids, torch.tensor([t.tokens[i] for i in first[:k]], dtype=q.ids.dtype))] = 0
            assert torch.allclose(qk.probs, expected / expected.sum())
            # q at the node's own token, as verification reads it
            assert qk.token_prob == pytest.approx(float(qk.probs[q.ids == t.tokens[node]].item())) and qk.token_prob > 0
    assert max(sum(1 for i in range(1, t.size) if t.parents[i] == 0) for _, t in drafted) == siblings


@torch.inference_mode()
def _path_logp(head, model, ids: list[int], path: list[int]) -> dict[int, float]:
    """Reference: the head run once, causally, over the true features of ``ids`` (the committed
    tokens) and then its own predicted features along ``path``; token -> log-probability after it."""
    from training.data import target_features

    feats = target_features(model, [ids], torch.device("cpu"))[0][0].to(head.fc.weight.dtype)  # [n, H]
    toks, f_in = list(ids[1:]), [feats[i] for i in range(len(ids) - 1)]
    out = None
    for step in range(len(path) + 1):
        n = len(toks)
        h = head.entry(torch.tensor(toks), torch.stack(f_in))
        q, k, v = head.qkv_rope(h, torch.arange(n))
        g = q.shape[1] // k.shape[1]
        attn = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1),
            attn_mask=torch.ones(n, n, dtype=torch.bool).tril()).transpose(0, 1).reshape(n, -1)
        out = head.finish(h, attn)
        if step < len(path):
            toks.append(path[step])
            f_in.append(out[-1])
    logp = torch.log_softmax(head.logits(out[-1:]).float()[0], -1)
    return dict(zip(head.draft_vocab.tolist(), logp.tolist()))


def test_each_candidates_score_is_the_heads_log_prob_after_its_own_path(monkeypatch, tiny_target_dir,
                                                                        attentive_head, tiny_prompts):
    """Siblings share a depth and a cache range: a node must see its own ancestors' head entries
    (at their positions) and no one else's, or the candidates of a second-choice branch are scored
    by the wrong context. Every candidate's own log-probability (its path score minus its parent's)
    must be what the head gives after that candidate's path, computed from scratch."""
    import actors.proposers.eagle as mod
    from actors.model.loader import load_model

    pools = []

    class Recording(DraftPool):
        def __init__(self, root_token):
            super().__init__(root_token)
            pools.append(self)

    monkeypatch.setattr(mod, "DraftPool", Recording)
    model = load_model(tiny_target_dir).model
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{attentive_head}", k=3, tree_width=2)
    seen = _record_trees(eng.proposer)
    eng.generate(tiny_prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True), concurrency=1)
    assert len(pools) == len(seen)
    errors, deep = [], 0
    for (r, _), pool in zip(seen, pools):
        for i, tok in enumerate(pool.tokens):
            path, p = [], pool.parents[i]
            while p >= 0:
                path.insert(0, pool.tokens[p])
                p = pool.parents[p]
            deep += len(path) >= 2
            own = pool.scores[i] - (pool.scores[pool.parents[i]] if pool.parents[i] >= 0 else 0.0)
            errors.append(abs(own - _path_logp(eng.proposer.head, model, r.token_ids, path)[tok]))
    assert deep >= 8 and len(errors) >= 40
    # bf16 rounding moves the correct scores by up to ~0.1 here; a node that also sees its siblings'
    # entries, or sits one position off, is off by 0.5-0.8
    assert max(errors) < 0.2, sorted(errors)[-5:]


def test_a_cpu_engine_drafts_the_cpu_shape(tiny_target_dir, tiny_head):
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=None)  # the shape left unset
    assert (eng.drafting.spec.tree_width, eng.drafting.spec.sampled_siblings) == (2, 1)
    assert (eng.proposer.tree_width, eng.proposer.siblings) == (2, 1)
    assert eng.config.speculative.tree_width == 3  # the configuration as given, resolved for the engine only


def test_draft_source_memo_holds_one_step_without_a_policy(tiny_target_dir, tiny_head, tiny_prompts):
    """A fixed-depth EAGLE tree looks up each sequence's draft source every step (nodes per depth);
    the planner's memo keeps only the current step's, so a long-lived server's does not grow."""
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{tiny_head}", k=3, tree_width=3, adaptive=False)
    assert eng.spec_policy is None
    sizes = []
    for i, p in enumerate(tiny_prompts[:3]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
        sizes.append(len(eng.drafting.sources))
    assert max(sizes) > 0, "the tree's width was never looked up"
    assert max(sizes) <= 3, "the draft-source memo outlived its step"
