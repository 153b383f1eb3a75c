"""actors/model/gguf_weights.py: a GGUF-loaded model's products read the file's own blocks, matched
row by row to its (fused, permuted) fp32 matrices, bound only where they reproduce them bit for bit;
the match is cached and checked; the forward keeps its bits with fp32 activations and stays close
with the default 16-bit fixed-point ones. A tiny model whose weights are the
dequantization of blocks written here into a GGUF file, and the default model's own file."""
from __future__ import annotations

import pytest
import torch

from actors.model import gguf_weights
from kernels import cpu_linear, cpu_native
from kernels import gguf_blocks as gb
from tests.test_gguf_blocks import gguf_rows, random_blocks

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason=f"CPU kernels not built: {cpu_native.unavailable_reason()}")


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir("llama", seed=4, intermediate_size=128)  # tied embedding, every K a multiple of 32


def quantized_model(tiny_dir, path, seed: int = 0):
    """The tiny model with every matrix replaced by a dequantization of random blocks, and a GGUF file at
    ``path`` holding those blocks as the converter sees them: fused matrices split into their parts,
    each part's rows reversed (as llama q/k rows are permuted), the embedding Q8_0, the rest Q4_1."""
    from gguf import GGMLQuantizationType, GGUFWriter

    from actors.model.loader import load_model

    model = load_model(tiny_dir, dtype=torch.float32).model
    writer = GGUFWriter(str(path), "llama")
    with torch.no_grad():
        for i, (name, w) in enumerate(gguf_weights.matrices(model).items()):
            kind = "Q8_0" if "embed" in name else "Q4_1"
            n, k = w.shape
            b = random_blocks(kind, n, k, seed=100 * seed + i)
            w.copy_(gb.dequantize(b))
            cut = n // 3 if "qkv" in name or "gate_up" in name else n
            for j, rows in enumerate((torch.arange(cut), torch.arange(cut, n))):
                if len(rows):
                    part = b.take(rows.flip(0))
                    writer.add_tensor(f"{name}.part{j}", gguf_rows(part),  # its shape: rows x bytes
                                      raw_dtype=getattr(GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def test_every_matrix_binds_to_its_blocks_and_the_forward_keeps_its_bits(tiny_dir, tmp_path, int16_activations):
    from actors.model.attention_backends import set_attention_backend
    from tests.model import Chunk, make_batch, random_ids, random_tables

    model = quantized_model(tiny_dir, tmp_path / "m.gguf")
    assert set_attention_backend(model, "native") == "native"
    t = random_tables(2, 4, 16, seed=1)
    steps = [[Chunk(random_ids(19, 256, 1), 0, t[0]), Chunk(random_ids(7, 256, 2), 0, t[1])],
             [Chunk([3], 19, t[0]), Chunk(random_ids(5, 256, 3), 7, t[1])]]

    def forward():
        kv = model.allocate_kv_cache(16, 16)
        with torch.inference_mode():
            return [model.compute_logits(model(make_batch(s, 16), kv)) for s in steps]

    before = forward()  # the fp32 packs
    bound = gguf_weights.bind(model, tmp_path / "m.gguf", tmp_path)  # the default activations: int16
    mats = gguf_weights.matrices(model)
    assert set(bound) == set(mats) and bound["embed_tokens.weight"] == "Q8_0"
    assert gguf_weights.num_bound(model) == len(mats)
    assert (tmp_path / gguf_weights.CACHE_NAME).is_file()
    fixed = forward()
    for a, b in zip(before, fixed):  # activations rounded to 15-16 bits: close, not the same bits
        assert float((b - a).abs().max()) < 1e-3 * float(a.abs().max())
    assert not all(torch.equal(a, b) for a, b in zip(before, fixed))
    with cpu_native.activations("float32"):
        assert all(torch.equal(a, b) for a, b in zip(before, forward()))  # fp32 activations: the same bits


def test_each_tensor_parallel_rank_caches_its_own_rows():
    from types import SimpleNamespace

    from actors.model.layers import TPContext

    assert gguf_weights.cache_name(SimpleNamespace(tp=TPContext.single())) == gguf_weights.CACHE_NAME
    names = {gguf_weights.cache_name(SimpleNamespace(tp=TPContext(rank=r, size=2))) for r in (0, 1)}
    assert len(names) == 2 and gguf_weights.CACHE_NAME not in names
    assert all(n.endswith(".safetensors.cache") for n in names)


def test_the_match_is_cached_checked_and_redone_when_it_does_not_fit(tiny_dir, tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    quantized_model(tiny_dir, gguf)
    reads = []
    real = gguf_weights.read_blocks
    monkeypatch.setattr(gguf_weights, "read_blocks", lambda p: reads.append(p) or real(p))
    first = quantized_model(tiny_dir, tmp_path / "again.gguf")  # the same weights, a fresh model
    assert gguf_weights.bind(first, gguf, tmp_path) and len(reads) == 1
    again = quantized_model(tiny_dir, tmp_path / "again.gguf")
    assert set(gguf_weights.bind(again, gguf, tmp_path)) == set(gguf_weights.matrices(again)) and len(reads) == 1
    other = quantized_model(tiny_dir, tmp_path / "other.gguf", seed=1)  # other weights: the cache must not fit
    assert gguf_weights.bind(other, gguf, tmp_path) == {} and len(reads) == 2
    assert all(cpu_linear.reordered(w).dtype is torch.float32 for w in gguf_weights.matrices(other).values())


def test_a_matrix_the_file_does_not_reproduce_keeps_its_fp32_product(tiny_dir, tmp_path):
    model = quantized_model(tiny_dir, tmp_path / "m.gguf")
    mats = gguf_weights.matrices(model)
    changed = "layers.1.mlp.down_proj.weight"
    with torch.no_grad():
        mats[changed][3, 5] += 1e-3
    bound = gguf_weights.bind(model, tmp_path / "m.gguf", None)
    assert changed not in bound and len(bound) == len(mats) - 1
    assert cpu_linear.reordered(mats[changed]).dtype is torch.float32


def test_the_switch_turns_it_off_and_a_bad_value_is_named(tiny_dir, tmp_path, monkeypatch):
    model = quantized_model(tiny_dir, tmp_path / "m.gguf")
    monkeypatch.setenv("SPECRAY_CPU_WEIGHTS", "float32")
    assert gguf_weights.bind(model, tmp_path / "m.gguf", tmp_path) == {}
    monkeypatch.setenv("SPECRAY_CPU_WEIGHTS", "int4")
    with pytest.raises(ValueError, match="SPECRAY_CPU_WEIGHTS='int4'"):
        gguf_weights.bind(model, tmp_path / "m.gguf", tmp_path)


def test_the_default_model_streams_its_own_q4_1_and_q8_0_blocks():
    """Every matrix of SmolLM2-135M (fused qkv and gate_up, permuted q and k rows, the tied LM head)."""
    from actors.model.loader import load_model
    from actors.model.registry import DEFAULT_MODEL

    model = load_model(DEFAULT_MODEL).model
    kinds = {cpu_linear.reordered(w).shape[-1] for w in gguf_weights.matrices(model).values()}
    assert len(gguf_weights.matrices(model)) == 121 and kinds == {gb.TILE_BYTES["Q4_1"], gb.TILE_BYTES["Q8_0"]}


@pytest.mark.model
def test_a_shard_given_the_directory_and_its_gguf_reads_the_blocks(default_model):
    """Tensor-parallel shards load the converted directory; with the GGUF file it came from
    (ShardSpec.gguf, which ShardGroup.create sets) their products read its blocks, as an in-process
    engine's do. Without it they streamed the fp32 weights, 5.6x the bytes per decode step."""
    from actors.model.loader import gguf_file, load_model
    from actors.verifier_shard import ShardSpec, VerifierShard

    path = gguf_file("smollm2-135m")
    assert path is not None
    assert gguf_weights.num_bound(load_model(default_model.model_dir).model) == 0  # the directory alone
    shard = VerifierShard(ShardSpec(str(default_model.model_dir), 1, 16, 16, gguf=str(path)), 0)
    info = shard.setup()
    mats = gguf_weights.matrices(shard.verifier.model)
    assert info["gguf_matrices"] == gguf_weights.num_bound(shard.verifier.model) == len(mats) > 0


@pytest.mark.model
def test_a_shard_group_of_a_gguf_model_hands_its_shards_the_file(default_model, monkeypatch):
    """ShardGroup.create resolves the alias to the converted directory once and passes the GGUF file
    beside it (the group's start is replaced here: no Ray)."""
    from cluster import shard_group

    specs = []
    monkeypatch.setattr(shard_group.ShardGroup, "__init__", lambda self, spec, *a, **k: specs.append(spec))
    shard_group.ShardGroup.create("smollm2-135m", 1, 16, 16, placement_group=object(), cpu_activations="int8")
    shard_group.ShardGroup.create(str(default_model.model_dir), 1, 16, 16, placement_group=object())
    (from_gguf, from_dir) = specs
    assert from_gguf.model == from_dir.model == str(default_model.model_dir)
    assert from_gguf.gguf is not None and from_gguf.gguf.endswith(".gguf") and from_dir.gguf is None
    assert from_gguf.cpu_activations == "int8" and from_dir.cpu_activations == "auto"
