"""A bf16 KV cache under an fp32 model (``kv_cache_dtype``, CPU native kernels): the kernels read it
as its exact fp32 widening and write it rounded to nearest even; the engine sizes twice the blocks
for the same bytes, stays greedy-lossless under speculation, and refuses the option where nothing
reads such a cache, naming the value."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from kernels import cpu_native as cn
from tests.model.test_tree_attention import PARENTS, ancestor_mask
from tests.tiny import TINY_MAX_TOKENS, tiny_engine

pytestmark = pytest.mark.skipif(not cn.load(), reason="the native CPU kernels are not built here")


def test_attention_reads_a_bf16_cache_as_its_fp32_widening():
    g = torch.Generator().manual_seed(0)
    h, kvh, d, bs = 9, 3, 32, 16
    k, v = torch.randn(30, bs, kvh, d, generator=g).bfloat16(), torch.randn(30, bs, kvh, d, generator=g).bfloat16()
    n = len(PARENTS)
    q = torch.randn(n + 1 + 17, h, d, generator=g)
    tables = torch.randperm(30, generator=g)[:24].view(3, 8)
    qsl, lens = torch.tensor([0, n, n + 1, n + 18]), torch.tensor([90, 41, 128])
    windows = [ancestor_mask(PARENTS), None, None]
    got = cn.paged_attention(q, k, v, qsl, lens, tables, 0.2, windows)
    assert torch.equal(got, cn.paged_attention(q, k.float(), v.float(), qsl, lens, tables, 0.2, windows))
    with pytest.raises(RuntimeError, match="of one dtype, got BFloat16 and Float"):
        cn.paged_attention(q, k, v.float(), qsl, lens, tables, 0.2, windows)
    odd = torch.zeros(4, bs, kvh, 24, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="multiple of 16, got 24"):
        cn.paged_attention(torch.randn(1, h, 24), odd, odd, torch.tensor([0, 1]), torch.tensor([3]),
                           torch.tensor([[0]]), 0.2)


def test_rope_write_kv_rounds_into_a_bf16_cache():
    g = torch.Generator().manual_seed(1)
    h, kvh, d, n = 4, 2, 16, 6
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g) * 3
    cos, sin = torch.rand(n, d // 2, generator=g), torch.rand(n, d // 2, generator=g)
    slots = torch.tensor([0, 9, -1, 17, 30, 5])  # -1: a padded row, nothing written
    k32, v32 = torch.zeros(4, 8, kvh, d), torch.zeros(4, 8, kvh, d)
    k16, v16 = k32.bfloat16(), v32.bfloat16()
    q32 = cn.rope_write_kv(qkv, cos, sin, slots, k32, v32, h, kvh)
    q16 = cn.rope_write_kv(qkv, cos, sin, slots, k16, v16, h, kvh)
    assert torch.equal(q16, q32)  # the queries stay fp32
    assert torch.equal(k16, k32.bfloat16()) and torch.equal(v16, v32.bfloat16())
    assert k16.view(-1, kvh, d)[9].abs().sum() > 0 and not k16.view(-1, kvh, d)[1].any()


def test_the_engine_holds_twice_the_blocks_and_stays_lossless(tiny_target_dir, tiny_prompts):
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    sized = dict(num_kv_blocks=None, kv_cache_gb=0.002)
    fp32 = tiny_engine(tiny_target_dir, **sized)
    plain = tiny_engine(tiny_target_dir, kv_cache_dtype="bfloat16", **sized)
    assert plain.verifier.kv_caches[0][0].dtype is torch.bfloat16
    assert plain.verifier.num_blocks == 2 * fp32.verifier.num_blocks
    want = [o.token_ids for o in plain.generate(tiny_prompts, params, concurrency=4)]
    spec = tiny_engine(tiny_target_dir, draft="layerskip:2", tree=[2, 2, 1], kv_cache_dtype="bfloat16", **sized)
    outs = spec.generate(tiny_prompts, params, concurrency=4)
    assert [o.token_ids for o in outs] == want
    assert sum(o.num_draft_tokens for o in outs) > 0


def test_engines_sharing_a_verifier_share_its_bf16_cache(tiny_target_dir, tiny_prompts):
    """specray bench builds one engine per variant over one verifier (and its KV cache)."""
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    first = tiny_engine(tiny_target_dir, kv_cache_dtype="bfloat16")
    second = LLMEngine(first.config.model_copy(update={"speculative": EngineConfig().speculative}),
                       loaded=first.loaded, verifier=first.verifier)
    assert second.verifier.kv_caches[0][0].dtype is torch.bfloat16
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert [o.token_ids for o in second.generate(tiny_prompts[:2], params)] == \
        [o.token_ids for o in first.generate(tiny_prompts[:2], params)]


def test_a_bf16_cache_is_refused_where_nothing_reads_it(tiny_target_dir):
    from cluster.config import EngineConfig

    with pytest.raises(ValueError, match="kv_cache_dtype='bfloat16' under a float32 model needs the in-process "
                                         "native CPU attention"):
        tiny_engine(tiny_target_dir, kv_cache_dtype="bfloat16", attention_backend="torch")
    with pytest.raises(ValidationError, match="fp8"):
        EngineConfig(kv_cache_dtype="fp8")
    assert tiny_engine(tiny_target_dir, kv_cache_dtype="float32").verifier.kv_caches[0][0].dtype is torch.float32


def test_the_cli_passes_the_option():
    from cluster.cli import build_parser, engine_config_from_args

    args = build_parser().parse_args(["generate", "--kv-cache-dtype", "bfloat16", "hi"])
    assert engine_config_from_args(args).kv_cache_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--kv-cache-dtype", "fp8", "hi"])
