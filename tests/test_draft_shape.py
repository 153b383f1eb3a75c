"""The draft's shape as configured (cluster/config.SpeculativeConfig): dynamic-tree width and node
cap, sampled siblings, their checks, the CLI flag, and what is left unset chosen for the device the
engine runs on (``for_device``), also after the configuration travelled as JSON to a Serve replica.
The trees themselves: tests/test_dynamic_tree.py."""
from __future__ import annotations

import json

import pytest


def test_tree_width_needs_an_eagle_head():
    from cluster.config import SpeculativeConfig

    with pytest.raises(ValueError, match="tree_width=3"):
        SpeculativeConfig.from_draft_arg("ngram", 5, tree_width=3)
    with pytest.raises(ValueError, match="tree_width=2"):
        SpeculativeConfig.from_draft_arg("default", 5, tree="1,2", tree_width=2)
    assert SpeculativeConfig.from_draft_arg("default", 4, tree_width=3).max_nodes == 12
    # unset: EAGLE drafts grow the default capped tree, a fixed tree or another method stays as asked
    dflt = SpeculativeConfig.from_draft_arg("default", 5)
    assert (dflt.tree_width, dflt.tree_nodes, dflt.max_nodes) == (3, 10, 10)
    assert SpeculativeConfig.from_draft_arg("eagle", 2).max_nodes == 6
    assert SpeculativeConfig.from_draft_arg("default", 5, tree="1,2,1").tree_width == 1
    assert SpeculativeConfig.from_draft_arg("ngram", 5).max_nodes == 5
    assert SpeculativeConfig.from_draft_arg("default", 5, tree_width=1).max_nodes == 5
    assert SpeculativeConfig.from_draft_arg("default", 4, tree_width=3, tree_nodes=7).max_nodes == 7
    assert SpeculativeConfig.from_draft_arg("default", 2, tree_width=3, tree_nodes=7).max_nodes == 6
    with pytest.raises(ValueError, match="tree_nodes=7"):
        SpeculativeConfig.from_draft_arg("ngram", 4, tree_nodes=7)
    with pytest.raises(ValueError, match="tree_nodes=7"):
        SpeculativeConfig.from_draft_arg("default", 4, tree_width=1, tree_nodes=7)
    with pytest.raises(ValueError, match="tree_nodes"):
        SpeculativeConfig.from_draft_arg("default", 4, tree_width=3, tree_nodes=0)
    # sampled siblings: at most the width whose nodes are reserved
    assert SpeculativeConfig.from_draft_arg("default", 5, sampled_siblings=2).sampled_siblings == 2
    with pytest.raises(ValueError, match="sampled_siblings=4: at most the tree width \\(3\\)"):
        SpeculativeConfig.from_draft_arg("default", 5, sampled_siblings=4)
    with pytest.raises(ValueError, match="sampled_siblings=2: at most the tree width \\(1\\)"):
        SpeculativeConfig.from_draft_arg("ngram", 5, sampled_siblings=2)
    with pytest.raises(ValueError, match="sampled_siblings"):
        SpeculativeConfig.from_draft_arg("default", 5, sampled_siblings=0)


def test_the_draft_shape_left_unset_is_chosen_for_the_device():
    """On the CPU a verified row costs ~10% of a decode step: width-2 trees and one sampled draw; on a
    GPU width 3 and three. What a user sets stays."""
    from cluster.config import SpeculativeConfig

    def shape(device, **kw):
        s = SpeculativeConfig.from_draft_arg("default", 5, **kw).for_device(device)
        return s.tree_width, s.tree_nodes, s.sampled_siblings

    assert shape("cpu") == (2, 10, 1) and shape("cuda") == (3, 10, 3)
    assert shape("cpu", tree_width=3) == (3, None, 1) and shape("cuda", tree_width=2) == (2, None, 2)
    assert shape("cpu", sampled_siblings=3) == (3, 10, 3)  # three draws need a width of three
    assert shape("cpu", tree_width=1) == (1, None, 1)
    ngram = SpeculativeConfig.from_draft_arg("ngram", 5).for_device("cpu")
    assert (ngram.tree_width, ngram.sampled_siblings) == (1, 1)


def test_a_default_width_survives_the_trip_to_a_serve_replica():
    """Serve hands each replica the app's args as JSON: a width left to the default must still be
    the device's default where the engine is rebuilt (and a width set stays set)."""
    from cluster.config import EngineConfig, SpeculativeConfig
    from deployments.serve_config import ServeArgs

    for kw, cpu_width in (({}, 2), ({"tree_width": 3}, 3)):
        args = ServeArgs(engine=EngineConfig(speculative=SpeculativeConfig.from_draft_arg("default", 5, **kw)))
        again = ServeArgs.model_validate(json.loads(json.dumps(args.model_dump(mode="json"))))
        spec = again.engine.speculative
        assert (spec.tree_width, spec.tree_nodes) == (3, 10 if not kw else None)
        assert spec.for_device("cpu").tree_width == cpu_width and spec.for_device("cuda").tree_width == 3


def test_sampled_siblings_flag_reaches_the_engine_config():
    from cluster.cli import build_parser, engine_config_from_args

    args = build_parser().parse_args(["generate", "--prompt", "x", "--draft", "default", "--sampled-siblings", "2"])
    assert engine_config_from_args(args).speculative.sampled_siblings == 2
    args = build_parser().parse_args(["generate", "--prompt", "x", "--draft", "default"])
    assert engine_config_from_args(args).speculative.sampled_siblings is None
