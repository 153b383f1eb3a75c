"""The attention backend switch (config, CLI, Serve args, the model hooks) and the engine on the
triton backend: token-identical greedy output to the torch backend on the tiny random model, with
and without speculation. On CPU the kernels run under ``TRITON_INTERPRET=1`` (set below)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from actors.model import attention_backends as ab  # noqa: E402
from actors.model.attention import paged_attention  # noqa: E402
from actors.model.loader import load_model  # noqa: E402
from actors.sampling_params import SamplingParams  # noqa: E402
from cluster.config import EngineConfig  # noqa: E402
from tests.model import Chunk, make_batch, random_ids, random_tables  # noqa: E402
from tests.model.test_tree_attention import PARENTS, ancestor_mask, tree_depths  # noqa: E402
from tests.tiny import BACKEND_SPECS, generate_per_backend, random_prompts  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CUDA the same tests run compiled


def test_config_cli_and_serve_args_carry_the_backend():
    from cluster.cli import build_parser, engine_config_from_args
    from deployments.serve_config import ServeArgs

    assert EngineConfig().attention_backend == "auto"
    with pytest.raises(ValidationError, match="attention_backend"):
        EngineConfig(attention_backend="cuda")
    args = build_parser().parse_args(["generate", "--attention-backend", "triton", "hi"])
    assert engine_config_from_args(args).attention_backend == "triton"
    assert engine_config_from_args(build_parser().parse_args(["generate", "hi"])).attention_backend == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--attention-backend", "flash", "hi"])
    assert ServeArgs(engine={"attention_backend": "torch"}).engine.attention_backend == "torch"


def test_resolve_backend():
    from kernels import cpu_native

    assert ab.resolve_backend("auto", "cpu") == ("native" if cpu_native.load() else "torch")
    assert ab.resolve_backend("auto", "cpu", torch.bfloat16) == "torch"  # the C++ kernels are fp32
    assert ab.resolve_backend("auto", "cuda") == "triton"
    assert ab.resolve_backend("triton", "cpu") == "triton"
    with pytest.raises(ValueError, match="flash"):
        ab.resolve_backend("flash", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_triton_on_cpu_without_the_interpreter_is_a_clear_error():
    code = ("import torch; from actors.model.attention_backends import set_attention_backend as s\n"
            "try: s(torch.nn.Linear(2, 2), 'triton')\n"
            "except ValueError as e: print(e)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent, env=env,
                         capture_output=True, text=True, timeout=300)
    assert "needs a CUDA device" in res.stdout and "'auto' or 'torch'" in res.stdout, res.stdout + res.stderr


@pytest.fixture
def tiny_model(tiny_target_dir):
    model = load_model(tiny_target_dir, dtype=torch.float32, device=DEVICE).model
    yield model
    ab.set_attention_backend(model, "torch")


def test_set_backend_sets_and_resets_the_hooks(tiny_model):
    attn, norm, mlp = (tiny_model.layers[0].self_attn, tiny_model.layers[0].post_attention_layernorm,
                       tiny_model.layers[0].mlp)
    on_cuda = DEVICE == "cuda"
    assert ab.set_attention_backend(tiny_model, "auto") == ("triton" if on_cuda else ab.resolve_backend("auto", "cpu"))
    assert ab.set_attention_backend(tiny_model, "torch") == "torch"
    assert attn.attend is paged_attention and norm.fused_add_norm is None and attn.rope_write_kv is None
    assert ab.set_attention_backend(tiny_model, "triton") == "triton"
    assert attn.attend is ab.triton_paged_attention
    # fused ops: by default on CUDA only
    assert (norm.fused_add_norm is not None) == (mlp.fused_act is not None) == on_cuda
    ab.set_attention_backend(tiny_model, "triton", fused_ops=True)
    assert norm.fused_add_norm is not None and mlp.fused_act is not None and attn.rope_write_kv is not None
    ab.set_attention_backend(tiny_model, "torch")
    assert attn.attend is paged_attention and norm.fused_add_norm is None and mlp.fused_act is None
    assert norm.fused_norm is None


def _on_device(batch):
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "kv_lens", "block_tables"):
        setattr(batch, name, getattr(batch, name).to(DEVICE))
    batch.window_masks = [None if w is None else w.to(DEVICE) for w in batch.window_masks]
    return batch


def _mixed_forward(model):
    """Hidden states of a prefill, then a batch of a decode token, a tree and a prefill chunk."""
    bs = 16
    t = random_tables(3, 4, 16, seed=3)
    kv = model.allocate_kv_cache(16, bs)
    tree = Chunk(random_ids(len(PARENTS), 256, 4), 21, t[1], positions=[21 + d for d in tree_depths(PARENTS)],
                 window=ancestor_mask(PARENTS))
    with torch.inference_mode():
        first = model(_on_device(make_batch([Chunk(random_ids(17, 256, 1), 0, t[0]),
                                             Chunk(random_ids(21, 256, 2), 0, t[1]),
                                             Chunk(random_ids(9, 256, 3), 0, t[2])], bs)), kv)
        second = model(_on_device(make_batch([Chunk([5], 17, t[0]), tree, Chunk(random_ids(12, 256, 5), 9, t[2])],
                                             bs)), kv)
    return torch.cat([first, second])


@pytest.mark.parametrize("fused", [False, True], ids=["attention", "attention+fused-ops"])
def test_model_forward_matches_torch_backend(tiny_model, fused):
    ab.set_attention_backend(tiny_model, "torch")
    want = _mixed_forward(tiny_model)
    ab.set_attention_backend(tiny_model, "triton", fused_ops=fused)
    torch.testing.assert_close(_mixed_forward(tiny_model), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", sorted(BACKEND_SPECS))
def test_engine_greedy_output_is_identical(case, tiny_target_dir):
    """2 prompts, 8 tokens each, concurrency 2: the same tokens on both backends (trees included)."""
    spec = BACKEND_SPECS[case]
    runs = generate_per_backend(tiny_target_dir, spec, ("torch", "triton"), random_prompts(2, seed=3),
                                SamplingParams(max_tokens=8, ignore_eos=True), device=DEVICE)
    for backend, (attn, _) in runs.items():
        assert attn is (ab.triton_paged_attention if backend == "triton" else paged_attention)
    outs = {backend: o for backend, (_, o) in runs.items()}
    assert [o.token_ids for o in outs["triton"]] == [o.token_ids for o in outs["torch"]]
    if spec:
        assert sum(o.num_draft_tokens for o in outs["triton"]) > 0, "speculation never ran"
    if spec.get("tree"):
        assert sum(o.num_accepted_tokens for o in outs["triton"]) > 0, "no tree node was accepted"
