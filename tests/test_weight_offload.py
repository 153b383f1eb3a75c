"""Weight offload (actors/model/weight_offload.py): the last N decoder layers' matrices live in
host memory and stream into two staging slots per forward. Same logits and the same greedy tokens
with 0, some or all layers offloaded; what is streamed per forward; the knobs and their errors."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from actors.model.loader import load_model
from actors.model.weight_offload import OFFLOAD_SLOTS, layer_weight_bytes, layers_to_offload
from actors.sampling_params import SamplingParams
from actors.verifier import SeqChunk, Verifier
from cluster.config import EngineConfig
from kernels import cpu_linear
from tests.tiny import TINY_MAX_TOKENS, tiny_engine

NUM_LAYERS = 3  # the tiny target's


def _verifier(model_dir, offload: int) -> Verifier:
    model = load_model(str(model_dir), dtype=torch.float32).model  # a fresh model: offload changes it
    return Verifier(model, 32, 4, torch.device("cpu"), torch.float32, offload_layers=offload)


def _steps(v: Verifier) -> list[torch.Tensor]:
    """A prefill of 10 tokens, a decode token and a 3-node tree (two siblings) -> logits of each."""
    prefill = SeqChunk(list(range(20, 30)), list(range(10)), list(range(10)), 10, [0, 1, 2, 3])
    out = [v.forward_logits([prefill], list(range(10)))]
    out.append(v.forward_logits([SeqChunk([7], [10], [10], 11, [0, 1, 2, 3])], [0]))
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree = SeqChunk([9, 4, 5], [11, 12, 12], [11, 12, 13], 14, [0, 1, 2, 3], window_mask=mask)
    out.append(v.forward_logits([tree], [0, 1, 2]))
    return out


@pytest.mark.parametrize("packed", [True, False], ids=["onednn-layout", "plain-layout"])
def test_logits_identical_with_any_number_of_layers_offloaded(tiny_target_dir, packed, monkeypatch):
    # plain layout: the path CUDA takes (the layer's parameters are views of a staging slot)
    monkeypatch.setattr(cpu_linear, "ENABLED", packed and cpu_linear.ENABLED)
    base = _steps(_verifier(tiny_target_dir, 0))
    for n in range(1, NUM_LAYERS + 1):
        v = _verifier(tiny_target_dir, n)
        assert v.weight_offload.packed is (packed and cpu_linear.ENABLED)
        for a, b in zip(base, _steps(v)):
            assert torch.equal(a, b), f"offload_layers={n}"


def test_streams_each_layer_that_shares_a_slot_once_per_forward(tiny_model_dir):
    model_dir = tiny_model_dir("llama", seed=0, num_hidden_layers=6, tie_word_embeddings=False)
    v = _verifier(model_dir, 5)  # layers 1..5: slot 0 gets 1, 3, 5; slot 1 gets 2, 4
    w = v.weight_offload
    assert w.offloaded == [1, 2, 3, 4, 5] and w.num_slots == OFFLOAD_SLOTS
    _steps(v)
    before = w.layers_copied
    v.forward_logits([SeqChunk([3], [14], [14], 15, [0, 1, 2, 3])], [0])
    assert w.layers_copied - before == 5  # every offloaded layer, once
    assert w.bytes_copied == w.layers_copied * w.layer_bytes
    # only the staging slots hold the matrices on the "device": the offloaded parameters have no storage of their own
    for i in w.offloaded:
        assert all(p.stride() == (0, 0) for p in v.model.layers[i].parameters() if p.dim() == 2)
    assert w.host_bytes == 5 * layer_weight_bytes(v.model.layers[0])
    # a layer-skip forward (first 3 layers) streams what it runs, and the next full forward is still right
    ref = _verifier(model_dir, 0)
    chunk = lambda: [SeqChunk([8], [15], [15], 16, [0, 1, 2, 3])]  # noqa: E731
    _steps(ref), ref.forward_logits([SeqChunk([3], [14], [14], 15, [0, 1, 2, 3])], [0])
    assert torch.equal(v.forward_logits(chunk(), [0], num_layers=3), ref.forward_logits(chunk(), [0], num_layers=3))
    full = [SeqChunk([6], [16], [16], 17, [0, 1, 2, 3, 4])]
    assert torch.equal(v.forward_logits(full, [0]), ref.forward_logits(full, [0]))


def test_a_lone_or_odd_layer_stays_in_its_slot(tiny_target_dir):
    v = _verifier(tiny_target_dir, 1)
    _steps(v)
    assert v.weight_offload.layers_copied == 1 and v.weight_offload.num_slots == 1  # copied once, then resident
    v3 = _verifier(tiny_target_dir, 3)  # slot 0: layers 0 and 2, slot 1: layer 1 alone
    _steps(v3)
    before = v3.weight_offload.layers_copied
    v3.forward_logits([SeqChunk([3], [14], [14], 15, [0, 1, 2, 3])], [0])
    assert v3.weight_offload.layers_copied - before == 2


@pytest.mark.parametrize("draft", ["none", "ngram", "draft"])
def test_engine_greedy_output_identical_offloaded(tiny_target_dir, tiny_draft_dir, tiny_prompts, tiny_baseline, draft):
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    for n in (1, NUM_LAYERS):  # some and all layers
        eng = tiny_engine(tiny_target_dir, draft=draft, draft_dir=tiny_draft_dir, fresh_model=True,
                          offload={"layers": n})
        outs = eng.generate(tiny_prompts[:4], params, concurrency=2)
        assert [o.token_ids for o in outs] == tiny_baseline[:4], f"draft={draft} offload_layers={n}"
        assert eng.verifier.graphs is None and eng.verifier.weight_offload.bytes_copied > 0


def test_metrics_report_the_offloaded_weights(tiny_target_dir, tiny_prompts):
    from tests.test_metrics import sample_value

    eng = tiny_engine(tiny_target_dir, fresh_model=True, offload={"layers": 2})
    eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True))
    snap, w = eng.metrics.snapshot(), eng.verifier.weight_offload
    assert sample_value(snap, "specray:weight_offload_layers") == 2
    assert sample_value(snap, "specray:weight_offload_bytes_total") == w.bytes_copied > 0
    assert sample_value(snap, "specray:weight_offload_host_bytes") == w.host_bytes > 0
    assert sample_value(snap, "specray:weight_offload_copy_seconds_total") == w.copy_seconds > 0


def test_device_budget_picks_the_layers_to_offload(tiny_model_dir):
    model = load_model(str(tiny_model_dir("llama", seed=0, num_hidden_layers=6, tie_word_embeddings=False)),
                       dtype=torch.float32).model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    per_layer = layer_weight_bytes(model.layers[0])
    gib = 2.0**30
    assert layers_to_offload(model, total / gib) == 0  # it fits
    # two staging slots: offloading n >= 2 layers saves n - 2 of them; one byte short needs 3 out
    assert layers_to_offload(model, (total - 1) / gib) == 3
    assert layers_to_offload(model, (total - 2 * per_layer) / gib) == 4
    floor = total - 6 * per_layer + OFFLOAD_SLOTS * per_layer
    assert layers_to_offload(model, floor / gib) == 6
    with pytest.raises(ValueError, match=r"weights_device_gb=1e-06 is too small for this model"):
        layers_to_offload(model, 1e-6)


def test_offload_knobs_and_their_errors(tiny_target_dir):
    from cluster.cli import build_parser, engine_config_from_args

    args = build_parser().parse_args(["generate", "x", "--offload-layers", "4"])
    assert engine_config_from_args(args).offload.layers == 4
    args = build_parser().parse_args(["generate", "x", "--weights-device-gb", "2.5"])
    assert engine_config_from_args(args).offload.weights_device_gb == 2.5
    with pytest.raises(ValidationError, match=r"offload.layers=2 and offload.weights_device_gb=1.0 both set"):
        EngineConfig(offload={"layers": 2, "weights_device_gb": 1.0})
    with pytest.raises(ValidationError, match=r"layers"):
        EngineConfig(offload={"layers": -1})
    with pytest.raises(ValueError, match=r"offload_layers=4 is out of range: the model has 3 decoder layers"):
        tiny_engine(tiny_target_dir, fresh_model=True, offload={"layers": 4})
    v = _verifier(tiny_target_dir, 2)
    with pytest.raises(ValueError, match=r"already offloaded"):
        Verifier(v.model, 32, 4, torch.device("cpu"), torch.float32, offload_layers=1)


@pytest.mark.model
def test_default_model_same_greedy_tokens_with_half_and_all_layers_offloaded(default_model):
    from actors.model.loader import LoadedModel
    from cluster.config import SpeculativeConfig
    from cluster.engine import LLMEngine

    prompts = [[{"role": "user", "content": "Name three primary colors."}],
               [{"role": "user", "content": "Write a Python function that reverses a string."}]]
    params = SamplingParams(max_tokens=24)
    n = default_model.config.num_layers

    def run(layers: int, draft: str = "none") -> list[list[int]]:
        fresh = load_model(default_model.model_dir).model if layers else default_model.model
        loaded = LoadedModel(fresh, default_model.tokenizer, default_model.config, default_model.model_dir)
        cfg = EngineConfig(num_kv_blocks=128, num_threads=2, offload={"layers": layers},
                           speculative=SpeculativeConfig.from_draft_arg(draft, 4, None, adaptive=False))
        eng = LLMEngine(cfg, loaded=loaded)
        return [o.token_ids for o in eng.generate(prompts, params, chat=True)]

    base = run(0)
    assert run(n // 2) == base
    assert run(n, draft="ngram") == base
