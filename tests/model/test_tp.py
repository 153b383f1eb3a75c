"""Tensor parallelism: two gloo processes each load their shards of a tiny model and produce the
logits of TP=1 (prefill + mixed decode/tree step), holding about half the parameter bytes each."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from actors.model.layers import TPContext
from actors.model.loader import load_model
from tests.model import Chunk, make_batch, random_ids, random_tables
from tests.ports import free_port

BS = 4


def _steps(vocab: int) -> list[list[Chunk]]:
    ta, tb = random_tables(2, 6, 16, seed=3)
    a, b = random_ids(14, vocab, 1), random_ids(9, vocab, 2)
    window = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return [
        [Chunk(a[:12], 0, ta), Chunk(b[:8], 0, tb)],
        [Chunk(a[12:13], 12, ta), Chunk(b[8:9] + [5, 6], 8, tb, positions=[8, 9, 9], window=window)],
    ]


def run_steps(model, vocab: int, gather: str = "all") -> list[torch.Tensor | None]:
    kv = model.allocate_kv_cache(16, BS)
    with torch.inference_mode():
        return [model.compute_logits(model(make_batch(chunks, BS), kv), gather) for chunks in _steps(vocab)]


def _worker(rank: int, port: int, model_dirs: list[str], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1])
        results = []
        for model_dir in model_dirs:
            loaded = load_model(model_dir, tp=TPContext(rank, 2, group))
            vocab = loaded.config.vocab_size
            results.append({
                "all": run_steps(loaded.model, vocab),
                "rank0": run_steps(loaded.model, vocab, gather="rank0"),
                "bytes": loaded.model.param_bytes(),
            })
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_tp2_matches_tp1(tiny_model_dir, tmp_path):
    dirs = [
        tiny_model_dir("llama", tie_word_embeddings=False),  # 4 heads, 2 KV heads: one KV head per rank
        tiny_model_dir("qwen2", num_key_value_heads=1, vocab_size=255),  # KV head replicated, vocab padded
    ]
    mp.spawn(_worker, args=(free_port(), [str(d) for d in dirs], str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for i, model_dir in enumerate(dirs):
        single = load_model(model_dir).model
        want = run_steps(single, single.config.vocab_size)
        for rank in range(2):
            got = ranks[rank][i]
            for step, ref in enumerate(want):
                torch.testing.assert_close(got["all"][step], ref, atol=1e-4, rtol=0)
                if rank == 0:
                    torch.testing.assert_close(got["rank0"][step], ref, atol=1e-4, rtol=0)
                else:
                    assert got["rank0"][step] is None
            ratio = got["bytes"] / single.param_bytes()
            assert 0.45 < ratio < 0.6, ratio


def test_one_rank_shard_runs_the_verifier_path(tiny_target_dir):
    """A one-rank shard (tp=1) runs its Verifier directly: a prefill chunk that needs no logits
    still writes its K/V, pending slot copies apply first, and the logits equal a Verifier's."""
    from actors.verifier import SeqChunk, Verifier
    from actors.verifier_shard import ShardSpec, VerifierShard

    shard = VerifierShard(ShardSpec(str(tiny_target_dir), 1, 16, BS), 0)
    shard.setup()
    ref = Verifier(load_model(tiny_target_dir).model, 16, BS, torch.device("cpu"), torch.float32)
    table = [3, 7, 1]
    slot = lambda p: table[p // BS] * BS + p % BS  # noqa: E731
    ids = random_ids(9, 256, 4)
    prefill = SeqChunk(ids[:8], list(range(8)), [slot(p) for p in range(8)], 8, table[:2])
    logits, _ = shard.forward([prefill], [])
    ref.forward_logits([prefill], [])
    assert logits.shape[0] == 0
    decode = SeqChunk(ids[8:9], [8], [slot(8)], 9, table[:3])
    got, _ = shard.forward([decode], [0], copy_src=[slot(2)], copy_dst=[slot(5)])
    ref.copy_slots([slot(2)], [slot(5)])
    torch.testing.assert_close(got, ref.forward_logits([decode], [0]))
