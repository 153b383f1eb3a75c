"""Speculative sampling is lossless: chi-square of the speculative loop against the target's exact
distribution, negative controls the harness must reject, agreement with the reference sampler,
and greedy speculation reproducing the target's greedy output (toy models of tests/toy_lm.py)."""
from __future__ import annotations

import random

import pytest
import torch

from actors.sampling import greedy, logits_to_probs, sample
from actors.sampling_params import SamplingParams
from actors.spec_verify import (
    VerifyResult,
    _residual,
    reference_speculative_sample,
    verify_greedy,
    verify_sampling,
    verify_sampling_logits,
)
from actors.tree import SubsetProposal, TokenTree
from tests.toy_lm import (
    DRAFT_TOPK,
    P_FAIL,
    P_PASS,
    TARGET,
    TARGET_MINP,
    TARGET_TOPK,
    TRIALS,
    V,
    chi_square_pvalues,
    deterministic_tree,
    distinct_tree,
    generate,
    merged_sampled_children,
    merged_tree,
    sampled_tree,
    subset_tree,
)

def from_logits(temperature: float = 1.0, min_p: float = 0.0):
    """verify_sampling_logits as a verifier of target probabilities: logits log(p) * T at temperature T
    (fp32 rows, -inf where p is 0), so that softmax(logits / T) is p (under ``min_p``: p filtered)."""

    def verify(tree: TokenTree, target_probs: torch.Tensor, gen: torch.Generator) -> VerifyResult:
        logits = (target_probs.log() * temperature).float()
        return verify_sampling_logits(tree, logits, SamplingParams(temperature=temperature, min_p=min_p), gen)

    return verify


LOSSLESS_CASES = {
    "chain_k3_sampled": (sampled_tree(1, 3), TARGET),
    "chain_k3_deterministic_topk_target": (deterministic_tree(1, 3), TARGET_TOPK),
    "tree_iid_width3": (sampled_tree(3, 3), TARGET),
    "tree_iid_width2_topk_draft_and_target": (sampled_tree(2, 3, DRAFT_TOPK), TARGET_TOPK),
    "tree_deterministic_width3": (deterministic_tree(3, 3), TARGET),
    "tree_merged": (merged_tree, TARGET),
    "tree_merged_sampled_duplicates_kept": (merged_sampled_children(), TARGET),
    "distinct_siblings_width3": (distinct_tree(3, 3), TARGET),
    "distinct_siblings_width2_topk_draft_and_target": (distinct_tree(2, 3, DRAFT_TOPK), TARGET_TOPK),
    "subset_proposals_width3": (subset_tree(3, 3), TARGET),
    "from_logits_subset_width2": (subset_tree(2, 3), TARGET, from_logits()),
    "from_logits_merged_t0.5": (merged_tree, TARGET, from_logits(0.5)),
    "from_logits_deterministic_topk_target_t1.7": (deterministic_tree(2, 3), TARGET_TOPK, from_logits(1.7)),
    # chains at temperature only: every row read and every residual drawn by the native kernels
    "from_logits_subset_chain": (subset_tree(1, 3), TARGET, from_logits()),
    "from_logits_deterministic_chain_t1.3": (deterministic_tree(1, 3), TARGET, from_logits(1.3)),
}


@pytest.mark.parametrize("case", list(LOSSLESS_CASES))
def test_speculative_sampling_is_lossless(case):
    propose, target, *verify = LOSSLESS_CASES[case]
    samples = generate(propose, verify[0] if verify else verify_sampling, target, seed=1234, trials=TRIALS)
    pvalues = chi_square_pvalues(samples, target)
    print(f"\n{case}: chi-square p-values {pvalues}")
    assert min(pvalues.values()) > P_PASS, pvalues


@pytest.mark.parametrize("propose", [subset_tree(2, 3), sampled_tree(1, 3)], ids=["subset_width2", "chain_k3"])
def test_min_p_verification_from_logits_is_lossless(propose):
    """The target's rows are TARGET's logits and the request asks for min-p 0.1: what comes out has
    TARGET_MINP's distribution (the filter applied at every verified node), not TARGET's."""
    samples = generate(propose, from_logits(1.0, min_p=0.1), TARGET, seed=1234, trials=TRIALS)
    pvalues = chi_square_pvalues(samples, TARGET_MINP)
    print(f"\nmin_p 0.1: chi-square p-values {pvalues}")
    assert min(pvalues.values()) > P_PASS, pvalues
    assert min(chi_square_pvalues(samples, TARGET).values()) < P_FAIL  # the filter did change the output


# Negative controls: the same harness must reject subtly wrong verifiers.


def _wrong_recovery_from_target(tree: TokenTree, target_probs: torch.Tensor, gen: torch.Generator) -> VerifyResult:
    """Chain verifier that accepts with min(1, p/q) but samples the recovered token from p, not the residual."""
    node = 0
    for child in range(1, tree.size):
        token, q = tree.tokens[child], tree.draft_probs[child]
        u = float(torch.rand((), dtype=torch.float64, generator=gen))
        if u * float(q[token]) >= float(target_probs[node, token]):
            break
        node = child
    nodes = list(range(1, node + 1))
    return VerifyResult(nodes, tree.tokens[1 : node + 1], sample(target_probs[node], gen), node == tree.size - 1)


def _wrong_no_sibling_residual(tree: TokenTree, target_probs: torch.Tensor, gen: torch.Generator) -> VerifyResult:
    """Tree verifier that tests every sibling against the unchanged target p (no residual update
    between siblings), recovering from norm(max(0, p - q)) of the last one only."""
    kids, node, nodes = tree.child_lists(), 0, []
    while kids[node]:
        p = target_probs[node]
        for child in kids[node]:
            token, q = tree.tokens[child], tree.draft_probs[child]
            if float(torch.rand((), dtype=torch.float64, generator=gen)) * float(q[token]) < float(p[token]):
                break
        else:
            return VerifyResult(nodes, [tree.tokens[i] for i in nodes], sample(_residual(p, q, token), gen), False)
        node = child
        nodes.append(node)
    return VerifyResult(nodes, [tree.tokens[i] for i in nodes], sample(target_probs[node], gen), True)


@pytest.mark.parametrize(
    "propose, wrong_verify",
    [
        (sampled_tree(1, 3), _wrong_recovery_from_target),
        (sampled_tree(3, 3), _wrong_no_sibling_residual),
        (merged_sampled_children(fold_duplicates=True), verify_sampling),
        (distinct_tree(3, 3, renormalise=False), verify_sampling),
    ],
    ids=["chain_recover_from_target", "tree_no_sibling_residual", "merge_folds_sampled_duplicates",
         "distinct_siblings_checked_against_plain_q"],
)
def test_chi_square_rejects_a_lossy_variant(request, propose, wrong_verify):
    samples = generate(propose, wrong_verify, TARGET, seed=1234, trials=TRIALS)
    pvalues = chi_square_pvalues(samples, TARGET)
    print(f"\nnegative control {request.node.callspec.id}: chi-square p-values {pvalues}")
    assert min(pvalues.values()) < P_FAIL, pvalues


# --------------------------------------------------------------------------- oracle agreement, reproducibility


@pytest.mark.parametrize("deterministic", [False, True])
def test_verify_sampling_equals_reference_on_chains(deterministic):
    rng = random.Random(5)
    propose = deterministic_tree(1, 4) if deterministic else sampled_tree(1, 4)
    for seed in range(300):
        pos, root = rng.randrange(4), rng.randrange(V)
        tree = propose(pos, root, rng)
        target = TARGET.rows(tree, pos)
        q = None if deterministic else torch.stack(tree.draft_probs[1:])
        expected = reference_speculative_sample(tree.tokens[1:], q, target, torch.Generator().manual_seed(seed))
        assert verify_sampling(tree, target, torch.Generator().manual_seed(seed)).output_tokens == expected


def _dense(tree: TokenTree) -> TokenTree:
    """``tree`` with every SubsetProposal spread over the V tokens (0 outside its ids)."""
    def spread(q):
        if not isinstance(q, SubsetProposal):
            return q
        return torch.zeros(V, dtype=q.probs.dtype).index_copy_(0, q.ids, q.probs)
    return TokenTree(list(tree.tokens), list(tree.parents), [spread(q) for q in tree.draft_probs])


def test_subset_proposals_verify_as_their_dense_q():
    """A SubsetProposal is q over part of the vocabulary: verification gives the very tokens it
    gives for the same q spread over all V tokens, draw for draw."""
    rng, walked = random.Random(7), 0
    for seed in range(400):
        pos, root = rng.randrange(4), rng.randrange(V)
        tree = subset_tree(3, 3)(pos, root, rng)
        target = TARGET.rows(tree, pos)
        got = verify_sampling(tree, target, torch.Generator().manual_seed(seed))
        assert got == verify_sampling(_dense(tree), target, torch.Generator().manual_seed(seed))
        walked += len(got.accepted_nodes)
    assert walked > 100  # both accepted and rejected drafts were seen


def test_verify_from_logits_follows_the_probabilities_walk():
    """verify_sampling_logits makes the same draws as verify_sampling over logits_to_probs: the same
    accepted nodes for every seed, and (its last draw inverting the same CDF natively) the same
    next token but where a uniform lands within rounding of a CDF step."""
    rng, same = random.Random(3), 0
    params = SamplingParams(temperature=0.8)
    for seed in range(400):
        pos, root = rng.randrange(4), rng.randrange(V)
        tree = merged_tree(pos, root, rng)
        logits = (TARGET.rows(tree, pos).log() * 0.8).float()
        a = verify_sampling_logits(tree, logits, params, torch.Generator().manual_seed(seed))
        b = verify_sampling(tree, logits_to_probs(logits, 0.8), torch.Generator().manual_seed(seed))
        assert a.accepted_nodes == b.accepted_nodes and a.bonus == b.bonus
        same += a.next_token == b.next_token
    assert same >= 396, same


def test_verify_from_logits_names_a_wrong_shape():
    tree = TokenTree.chain(0, [1, 2])
    with pytest.raises(ValueError, match=r"logits must be \[3, V\] for this tree, got \(2, 6\)"):
        verify_sampling_logits(tree, torch.zeros(2, V), SamplingParams(temperature=1.0))


def test_same_seed_reproduces_and_different_seed_differs():
    def run(seed: int, global_seed: int) -> list[list[int]]:
        rng, gen = random.Random(0), torch.Generator().manual_seed(seed)  # same trees, verifier seed varies
        trees = [merged_tree(pos % 4, pos % V, rng) for pos in range(100)]
        with torch.random.fork_rng():
            torch.manual_seed(global_seed)  # the global RNG must not matter: only `gen` is used
            return [verify_sampling(t, TARGET.rows(t, i % 4), gen).output_tokens for i, t in enumerate(trees)]

    assert run(42, global_seed=1) == run(42, global_seed=2)
    assert run(42, global_seed=1) != run(43, global_seed=1)


@pytest.mark.parametrize(
    "propose",
    [sampled_tree(1, 3), sampled_tree(3, 2), deterministic_tree(3, 3), deterministic_tree(2, 3, TARGET), merged_tree],
    ids=["chain_sampled", "tree_sampled", "tree_deterministic", "tree_with_perfect_branch", "tree_merged"],
)
def test_greedy_speculation_reproduces_target_greedy_output(propose):
    greedy_next = TARGET.probs.argmax(-1).tolist()  # [pos][last token]
    rng, length, accepted = random.Random(0), 9, 0
    for root in range(V):
        expected = [root]
        for pos in range(length - 1):
            expected.append(greedy_next[pos][expected[-1]])
        seq = [root]
        while len(seq) < length:
            tree = propose(len(seq) - 1, seq[-1], rng)
            res = verify_greedy(tree, greedy(TARGET.rows(tree, len(seq) - 1)))
            seq += res.output_tokens
            accepted += len(res.accepted_tokens)
        assert seq[:length] == expected
    assert accepted > 0  # acceptance is exercised, not only recovery
