"""The EAGLE head's steps over its paged KV pool, padded as its CUDA graphs replay them
(actors/proposers/head_kv.py). On CPU the padded path runs eagerly (``capture=False``) with the
Triton attention and fused RoPE + KV write interpreted: it must draft the same trees as the
unpadded head and write no KV for padded rows. The graphs themselves run on a GPU."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from actors.model import attention_backends as ab  # noqa: E402
from actors.model.loader import load_model  # noqa: E402
from actors.proposers.eagle import build_eagle_proposer  # noqa: E402
from actors.proposers.head_kv import HeadGraphRunner, HeadKVPool  # noqa: E402
from actors.verifier import Verifier  # noqa: E402
from benchmarks.draft_cost import DraftLoop  # noqa: E402
from tests.tiny import random_eagle_head  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def triton_verifier(tiny_target_dir):
    model = load_model(tiny_target_dir, dtype=torch.float32, device=DEVICE).model
    ab.set_attention_backend(model, "triton", fused_ops=True)
    yield Verifier(model, 16, 4, DEVICE, torch.float32, enforce_eager=True)
    ab.set_attention_backend(model, "torch")


def _trees(loop: DraftLoop, steps: int) -> list[list[tuple[list[int], list[int]]]]:
    return [[(t.tokens, t.parents) for t in loop.step()] for _ in range(steps)]


@pytest.mark.parametrize("width", [1, 3])
def test_padded_head_steps_draft_what_the_eager_head_drafts(width, triton_verifier, tmp_path):
    path = random_eagle_head(triton_verifier.model, 64, tmp_path / "head.safetensors", seed=3)
    cfg = triton_verifier.model.config
    eager = build_eagle_proposer(str(path), "tiny", triton_verifier, width)
    padded = build_eagle_proposer(str(path), "tiny", triton_verifier, width)
    assert eager.head.rope_write_kv is not None, "the head takes the target's fused RoPE + KV write"
    padded.use_graphs(max_num_seqs=4, max_model_len=48, capture=False)
    loops = [DraftLoop(p, 3, 9, cfg.hidden_size, cfg.vocab_size, DEVICE, width) for p in (eager, padded)]
    want, got = _trees(loops[0], 4), _trees(loops[1], 4)
    assert got == want
    assert any(len(tokens) > 1 for step in got for tokens, _ in step), "nothing was drafted"
    assert padded.graphs.num_eager >= 5 * 4  # every head step went through the padded path
    # padded rows (slot -1) wrote nothing: only the slots of the sequences' blocks hold K/V
    used = torch.zeros(padded.kv.num_blocks * padded.kv.block_size, dtype=torch.bool)
    for table in padded.kv.tables.values():
        for b in table:
            used[b * padded.kv.block_size: (b + 1) * padded.kv.block_size] = True
    for cache in (padded.kv.k, padded.kv.v):
        flat = cache.reshape(used.shape[0], -1).cpu()
        assert not flat[~used].any(), "a padded row wrote to the head's KV pool"


@pytest.mark.parametrize("kind", ["seeded", "unseeded"])
def test_padded_steps_score_in_the_graph_what_the_eager_head_scores(kind, triton_verifier, tmp_path):
    """Sampled requests read the head's logits too (q): the scores the padded step computes inside
    its graph (and those of the eager fallback when a step wants more candidates than the graph
    keeps) give the drafts of the unpadded head."""
    from actors.sampling_params import SamplingParams

    path = random_eagle_head(triton_verifier.model, 64, tmp_path / "head.safetensors", seed=5)
    cfg = triton_verifier.model.config
    width = 2 if kind == "seeded" else 1  # seeded: a dynamic tree from the race; unseeded: a chain of draws
    made = [build_eagle_proposer(str(path), "tiny", triton_verifier, width) for _ in range(3)]
    for p in made[1:]:
        p.use_graphs(max_num_seqs=4, max_model_len=48, capture=False)
    made[2].graphs.top_k = 0  # every step wants more than the graph keeps: scored eagerly from its f̂
    loops = [DraftLoop(p, 3, 9, cfg.hidden_size, cfg.vocab_size, DEVICE, width) for p in made]
    for loop in loops:
        for r in loop.reqs:
            r.params = SamplingParams(temperature=1.0, seed=11 + r.seq_id if kind == "seeded" else None)
            r.generator = None if kind == "seeded" else torch.Generator().manual_seed(r.seq_id)
    want, in_graph, fallback = (_trees(loop, 4) for loop in loops)
    assert in_graph == want and fallback == want
    assert any(len(tokens) > 1 for step in want for tokens, _ in step), "nothing was drafted"


def test_head_graphs_need_a_fixed_pool_and_the_fused_write(triton_verifier, tmp_path):
    path = random_eagle_head(triton_verifier.model, 64, tmp_path / "head.safetensors")
    p = build_eagle_proposer(str(path), "tiny", triton_verifier, 1)
    with pytest.raises(ValueError, match="fixed HeadKVPool"):
        HeadGraphRunner(p.head, p.kv, p.attend, 4, 32, capture=False)
    p.head.rope_write_kv = None
    with pytest.raises(ValueError, match="fused RoPE"):
        p.use_graphs(4, 32, capture=False)


def test_head_kv_pool_reserves_grows_and_frees():
    pool = HeadKVPool(2, 8, torch.float32, torch.device("cpu"), block_size=4, num_blocks=2)
    assert pool.reserve(7, 6) == [0, 1]
    assert pool.slots(7, 3, 3) == [3, 4, 5]
    table = pool.reserve(9, 3)  # the pool is full: it doubles, the old blocks keep their K/V
    assert pool.num_blocks == 4 and len(table) == 1 and table[0] not in (0, 1)
    pool.release(7)
    assert pool.num_used == 1 and sorted(pool.free) == [0, 1, 3]
    fixed = HeadKVPool(2, 8, torch.float32, torch.device("cpu"), block_size=4, num_blocks=1, growable=False)
    with pytest.raises(RuntimeError, match="head KV pool full"):
        fixed.reserve(1, 5)


def test_graph_forwards_are_counted_for_the_metrics(triton_verifier, tmp_path):
    """specray:cuda_graph_forwards{model, mode}: the head's steps run through its runner (padded and
    eager here, replayed on a GPU) and one that fits no bucket (more sequences than captured) is an
    eager fallback; an engine without graphs exports no such series."""
    from cluster.metrics import EngineMetrics
    from tests.test_metrics import sample_value

    path = random_eagle_head(triton_verifier.model, 64, tmp_path / "head.safetensors", seed=3)
    cfg = triton_verifier.model.config
    p = build_eagle_proposer(str(path), "tiny", triton_verifier, 1)
    p.use_graphs(max_num_seqs=4, max_model_len=48, capture=False)
    loop = DraftLoop(p, 3, 9, cfg.hidden_size, cfg.vocab_size, DEVICE, 1)
    loop.step()
    assert p.graphs.run(p.graphs._dummy(5, 5), torch.zeros(5, cfg.hidden_size)) is None  # 5 > 4 sequences
    metrics = EngineMetrics()
    metrics.watch_graphs(target=triton_verifier, draft_head=p)  # the verifier runs eagerly: no graphs
    snap = metrics.snapshot()
    eager = sample_value(snap, "specray:cuda_graph_forwards_total", model="draft_head", mode="eager")
    assert eager == p.graphs.num_eager + 1 and p.graphs.num_fallbacks == 1 and p.graphs.num_eager >= 6
    assert sample_value(snap, "specray:cuda_graph_forwards_total", model="draft_head", mode="graph") == 0
    assert not [s for f in snap for s in f.samples if ("model", "target") in s[1]]
    plain = EngineMetrics()
    plain.watch_graphs(target=triton_verifier, draft_head=None)
    assert not [s for f in plain.snapshot() for s in f.samples if s[0].startswith("specray:cuda_graph_forwards")]
