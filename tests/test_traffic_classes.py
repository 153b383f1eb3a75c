"""Traffic classes (cluster/traffic.py): validation that names the bad value, matching and its
first-match order, the DraftPlanner's per-sequence caps, and on a tiny engine: a class that turns
speculation off reserves no draft slots and drafts nothing, a capped K drafts at most K deep, and
greedy output stays the target's own."""
from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from cluster.config import SpeculativeConfig
from cluster.traffic import TrafficClass, match
from tests.tiny import TINY_MAX_TOKENS, tiny_engine

PLAYBOOK = """
traffic_classes:            # the operator's playbook, phase 5
  - {name: short, max_tokens_below: 32, speculation: off}
  - {name: hot, temperature_above: 1.0, speculation: off}
  - {name: busy, running_above: 8, speculation: 2}
  - {name: long-greedy, max_tokens_at_least: 256, temperature_at_most: 0, speculation: on}
"""


def classes(text: str = PLAYBOOK) -> list[TrafficClass]:
    return SpeculativeConfig(method="ngram", **yaml.safe_load(text)).traffic_classes


# ---- config -------------------------------------------------------------------------------------
def test_yaml_on_off_and_numbers():
    cs = classes()
    assert [c.speculation for c in cs] == ["off", "off", 2, "on"]  # YAML 1.1 reads bare off/on as booleans
    assert [c.max_depth for c in cs] == [0, 0, 2, None]
    assert TrafficClass(name="x", speculation="3").max_depth == 3
    assert TrafficClass(name="x", speculation=" OFF ").max_depth == 0


@pytest.mark.parametrize("rule,names", [
    ({"name": "x", "speculation": "maybe"}, ["speculation='maybe'", "on, off or a number"]),
    ({"name": "x", "speculation": 65}, ["speculation=65", "(0..64)"]),
    ({"name": "x", "speculation": -1}, ["speculation=-1"]),
    ({"name": "x", "max_tokens_at_least": 256, "max_tokens_below": 32, "speculation": "off"},
     ["'x'", "max_tokens_at_least=256", "max_tokens_below=32", "match no request"]),
    ({"name": "x", "temperature_above": 1.0, "temperature_at_most": 1.0, "speculation": "off"},
     ["temperature_above=1.0", "temperature_at_most=1.0"]),
    ({"name": "x", "running_above": 8, "running_at_most": 4, "speculation": "off"}, ["running_above=8"]),
    ({"name": "x", "max_tokens_below": 0, "speculation": "off"}, ["max_tokens_below", "greater than or equal to 1"]),
    ({"name": "x", "max_token_below": 32, "speculation": "off"}, ["max_token_below"]),
    ({"speculation": "off"}, ["name"]),
])
def test_errors_name_the_bad_value(rule, names):
    with pytest.raises(ValidationError) as e:
        SpeculativeConfig(traffic_classes=[rule])
    for n in names:
        assert n in str(e.value)


def test_names_are_unique():
    with pytest.raises(ValidationError, match="traffic class name 'a' is used twice"):
        SpeculativeConfig(traffic_classes=[{"name": "a", "speculation": "on"}, {"name": "a", "speculation": "off"}])


def test_serve_config_loader_sees_misspelt_keys_inside_a_class():
    from cluster.config import EngineConfig
    from cluster.serve_config_file import unknown_keys

    data = {"speculative": {"traffic_classes": [{"name": "a", "speculation": "off", "max_token_below": 3}]}}
    assert [loc for loc, _ in unknown_keys(EngineConfig, data)] == [("speculative", "traffic_classes", 0,
                                                                    "max_token_below")]


# ---- matching -----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens,temperature,running,expected", [
    (31, 0.0, 1, "short"), (32, 0.0, 1, None),  # below 32: off; 32 is not short
    (100, 1.01, 1, "hot"), (100, 1.0, 1, None),  # above 1.0 only
    (100, 0.7, 9, "busy"), (100, 0.7, 8, None),  # more than 8 running
    (300, 0.0, 20, "busy"),  # the first matching class decides: busy before long-greedy
    (300, 0.0, 1, "long-greedy"), (300, 0.5, 1, None),
    (8, 2.0, 20, "short"),
])
def test_first_matching_class(max_tokens, temperature, running, expected):
    got = match(classes(), max_tokens, temperature, running)
    assert (got.name if got else None) == expected


def test_a_class_without_conditions_catches_everything():
    cs = classes("traffic_classes: [{name: greedy-on, temperature_at_most: 0, speculation: on}, "
                 "{name: rest, speculation: off}]")
    assert match(cs, 5, 0.0, 64).name == "greedy-on"
    assert match(cs, 5000, 0.3, 0).name == "rest"


# ---- the draft planner --------------------------------------------------------------------------
@pytest.fixture
def ngram_engine(tiny_target_dir):
    def make(traffic: str, k: int = 4):
        eng = tiny_engine(tiny_target_dir, draft="ngram", k=k)
        eng.drafting.spec = eng.drafting.spec.model_copy(update={"traffic_classes": classes(traffic)})
        return eng

    return make


def test_max_depth_for(ngram_engine):
    eng = ngram_engine(PLAYBOOK)
    seq = eng.add_request("a", [5, 6, 7, 5, 6, 7], SamplingParams(max_tokens=100))
    d = eng.drafting
    assert d.max_depth_for(seq, 1) is None and d.max_depth_for(seq, 9) == 2
    short = eng.add_request("b", [5, 6, 7], SamplingParams(max_tokens=8))
    assert d.max_depth_for(short, 1) == 0
    fixed = eng.add_request("c", [5, 6, 7], SamplingParams(max_tokens=8, spec_tokens=3))
    assert d.max_depth_for(fixed, 1) is None  # a request that fixed its K keeps it
    d.plain_step = True  # the guard: off (or a baseline probe) this step
    assert d.max_depth_for(seq, 1) == 0 and d.max_depth_for(fixed, 1) is None


def test_off_class_reserves_no_slots_and_drafts_nothing(ngram_engine, tiny_prompts, tiny_baseline):
    eng = ngram_engine("traffic_classes: [{name: short, max_tokens_below: 32, speculation: off}]")
    reserved = []
    budgets = eng.drafting.budgets
    eng.drafting.budgets = lambda running: reserved.append(budgets(running)) or reserved[-1]
    short = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    outs = eng.generate(tiny_prompts, short, concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    assert sum(o.num_draft_tokens for o in outs) == 0
    assert reserved and all(n == 0 for b in reserved for n in b.values())
    long = SamplingParams(max_tokens=32, ignore_eos=True)  # not in the class: speculates
    outs = eng.generate(tiny_prompts, long, concurrency=4)
    assert sum(o.num_draft_tokens for o in outs) > 0
    assert [o.token_ids[:TINY_MAX_TOKENS] for o in outs] == tiny_baseline


def test_capped_class_drafts_at_most_k_deep(ngram_engine, tiny_prompts, tiny_baseline):
    eng = ngram_engine("traffic_classes: [{name: capped, speculation: 2}]", k=4)
    outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    drafted = [o for o in outs if o.num_drafts]
    assert drafted, "the capped class still speculates"
    assert all(o.num_draft_tokens <= 2 * o.num_drafts and len(o.accepted_per_pos) <= 2 for o in drafted)
    uncapped = ngram_engine("traffic_classes: []", k=4)
    outs = uncapped.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=4)
    assert any(o.num_draft_tokens > 2 * o.num_drafts for o in outs), "without the cap, drafts go deeper"


def test_busy_and_hot_classes(ngram_engine, tiny_prompts):
    rules = ("traffic_classes: [{name: busy, running_above: 2, speculation: off}, "
             "{name: hot, temperature_above: 1.0, speculation: off}]")
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    hot = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True, temperature=1.5, seed=1)
    control = ngram_engine("traffic_classes: []")
    assert sum(o.num_draft_tokens for o in control.generate(tiny_prompts[:4], params, concurrency=4)) > 0
    assert sum(o.num_draft_tokens for o in control.generate(tiny_prompts[:2], hot, concurrency=2)) > 0
    eng = ngram_engine(rules)
    assert sum(o.num_draft_tokens for o in eng.generate(tiny_prompts[:2], params, concurrency=2)) > 0
    assert sum(o.num_draft_tokens for o in eng.generate(tiny_prompts[:4], params, concurrency=4)) == 0
    assert sum(o.num_draft_tokens for o in eng.generate(tiny_prompts[:2], hot, concurrency=2)) == 0
