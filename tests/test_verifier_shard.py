"""In-process parts of the tensor-parallel verifier: the step command's int64 encoding, the
topology checks, and a TP=1 VerifierShard equal to the plain Verifier (no Ray needed)."""
from __future__ import annotations

import pytest
import torch

from actors.model.config import ModelConfig
from actors.shard_protocol import (HEADER_LEN, OP_NOOP, check_command, header, pack_forward, payload_len,
                                   unpack_forward)
from actors.verifier import SeqChunk, Verifier, build_forward_batch
from actors.verifier_shard import ShardSpec, VerifierShard
from cluster.topology import ReplicaTopology, valid_tp_sizes, validate_tp

BS = 4
TREE_MASK = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)


def _chunks() -> list[SeqChunk]:
    return [
        SeqChunk(list(range(3, 13)), list(range(10)), list(range(4, 14)), 10, [1, 2, 3]),
        SeqChunk([7, 8, 9], [10, 11, 11], [30, 31, 32], 13, [5, 6, 7, 8], TREE_MASK),
        SeqChunk([5], [6], [42], 7, [10, 11]),
    ]


def test_pack_unpack_round_trip_equals_build_forward_batch():
    chunks, rows = _chunks(), [9, 10, 11, 12, 13]
    h, payload = pack_forward(chunks, rows, 2, [30, 31], [40, 41])
    assert h.shape == (HEADER_LEN,) and payload.numel() == payload_len(h)
    cmd = unpack_forward(h, payload, BS, torch.device("cpu"))
    want = build_forward_batch(chunks, BS, torch.device("cpu"))
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "kv_lens", "block_tables"):
        assert torch.equal(getattr(cmd.batch, name), getattr(want, name)), name
    assert cmd.batch.window_masks[0] is None and cmd.batch.window_masks[2] is None
    assert torch.equal(cmd.batch.window_masks[1], TREE_MASK)
    assert cmd.rows.tolist() == rows and cmd.num_layers == 2
    assert cmd.copy_src.tolist() == [30, 31] and cmd.copy_dst.tolist() == [40, 41]


def test_copy_only_command_and_headers():
    h, payload = pack_forward([], [], None, [1], [2])
    cmd = unpack_forward(h, payload, BS, torch.device("cpu"))
    assert cmd.batch is None and cmd.num_layers is None and cmd.copy_dst.tolist() == [2]
    assert payload_len(header(OP_NOOP)) == 0


def test_bad_commands_are_rejected_with_the_bad_value():
    with pytest.raises(ValueError, match="2 tokens, 2 positions, 3 slots"):
        pack_forward([SeqChunk([1, 2], [0, 1], [0, 1, 2], 2, [0])], [0], None)
    h, payload = pack_forward(_chunks(), [14], None)
    with pytest.raises(ValueError, match="logit row 14 is outside"):
        check_command(unpack_forward(h, payload, BS, torch.device("cpu")), 16, BS, 3)
    h, payload = pack_forward(_chunks(), [0], 7)
    with pytest.raises(ValueError, match="num_layers=7"):
        check_command(unpack_forward(h, payload, BS, torch.device("cpu")), 16, BS, 3)
    h, payload = pack_forward(_chunks(), [0], None, [64], [1])
    with pytest.raises(ValueError, match="copy src slot 64 is outside"):
        check_command(unpack_forward(h, payload, BS, torch.device("cpu")), 16, BS, 3)


def _cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                num_kv_heads=3, head_dim=64)
    return ModelConfig(**{**base, **kw})


def test_validate_tp_names_tp_and_heads():
    smol = _cfg()  # SmolLM2-135M: 9 heads, 3 KV heads -> tp in {1, 3}
    assert valid_tp_sizes(smol) == [1, 3]
    validate_tp(smol, 3)
    with pytest.raises(ValueError, match=r"tp=2 does not divide num_kv_heads=3.*use tp in \[1, 3\]"):
        validate_tp(smol, 2)
    with pytest.raises(ValueError, match="tp=4 exceeds num_kv_heads=3"):
        validate_tp(smol, 4)
    tiny = _cfg(num_heads=4, num_kv_heads=2, intermediate_size=128, hidden_size=64, head_dim=16)
    with pytest.raises(ValueError, match="tp=3 exceeds num_kv_heads=2"):
        validate_tp(tiny, 3)
    with pytest.raises(ValueError, match="tp=0"):
        validate_tp(tiny, 0)


def test_topology_bundles():
    topo = ReplicaTopology(tp_size=4, num_drafters=2, use_gpu=True)
    assert topo.bundles() == [{"CPU": 0.5, "GPU": 1.0}] * 4 + [{"CPU": 0.25}] * 2
    assert topo.drafter_bundle_index(1) == 5
    assert topo.describe().startswith("tp=4 needs 4 GPUs and 2 CPUs in one node")
    assert ReplicaTopology(tp_size=2).bundles() == [{"CPU": 0.5}] * 2
    with pytest.raises(ValueError):
        ReplicaTopology(tp_size=0)


def test_tp1_shard_in_process_equals_verifier(tiny_model_dir):
    from actors.model.loader import load_model

    model_dir = tiny_model_dir("llama", seed=0, tie_word_embeddings=False)
    shard = VerifierShard(ShardSpec(str(model_dir), 1, 16, BS, num_threads=torch.get_num_threads()), 0)
    info = shard.setup()
    assert info["tp_size"] == 1 and info["kv_heads_per_rank"] == 2
    ref = Verifier(load_model(model_dir).model, 16, BS, torch.device("cpu"), torch.float32)
    got, secs = shard.forward(_chunks(), [9, 10, 11, 12, 13])
    assert secs > 0
    torch.testing.assert_close(got, ref.forward_logits(_chunks(), [9, 10, 11, 12, 13]), atol=1e-5, rtol=0)
    # slot copies travel with the next forward and run before it
    ref.copy_slots([4, 5], [48, 49])
    nxt = [SeqChunk([3], [10], [50], 11, [1, 2, 12])]  # positions 8, 9 read the copied slots 48, 49
    torch.testing.assert_close(shard.forward(nxt, [0], None, [4, 5], [48, 49])[0], ref.forward_logits(nxt, [0]),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="slot 99 is outside"):
        shard.forward([SeqChunk([3], [0], [99], 1, [0])], [0])


def test_tp1_shard_streams_offloaded_layers_with_the_same_logits(tiny_model_dir):
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model

    model_dir = tiny_model_dir("llama", seed=0, tie_word_embeddings=False)
    shard = VerifierShard(ShardSpec(str(model_dir), 1, 16, BS, num_threads=torch.get_num_threads(),
                                    offload_layers=2), 0)
    shard.setup()
    assert shard.verifier.weight_offload.num_layers == 2
    ref_model = load_model(model_dir).model
    set_attention_backend(ref_model, "auto")  # the shard's kernels: bit-identical logits expected
    ref = Verifier(ref_model, 16, BS, torch.device("cpu"), torch.float32)
    got, _ = shard.forward(_chunks(), [9, 10, 11, 12, 13])
    assert torch.equal(got, ref.forward_logits(_chunks(), [9, 10, 11, 12, 13]))
    assert shard.verifier.weight_offload.bytes_copied > 0
