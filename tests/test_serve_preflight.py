"""What `specray serve` checks before Serve deploys anything: draft/TP combinations, TP sizes that
fit the model, and replicas that fit the cluster (each an error naming the values, within seconds)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.cli import BadInput
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.serve_cli import check_models, check_placement
from cluster.serve_config_file import ServeApp
from cluster.topology import unplaceable_reason
from deployments.serve_config import AutoscalingArgs, ServeArgs

TWO_CPUS = [{"CPU": 2.0, "memory": 1e10}]


def _app(**kw) -> ServeApp:
    args = ServeArgs(**kw)
    return ServeApp("specray", "/", None, args.model_name, args=args)


def test_eagle_draft_with_actors_is_refused_naming_both():
    eagle = EngineConfig(speculative=SpeculativeConfig.from_draft_arg("default", 5))
    for kw in (dict(tensor_parallel_size=3), dict(drafters=1)):
        with pytest.raises(ValidationError, match=r"EAGLE draft .*tensor_parallel_size=\d+ / drafters=\d+"):
            ServeArgs(engine=eagle, **kw)
    assert ServeArgs(engine=eagle).engine.speculative.method == "eagle"  # in-process is fine
    ngram = EngineConfig(speculative=SpeculativeConfig.from_draft_arg("ngram", 5))
    assert ServeArgs(engine=ngram, tensor_parallel_size=3, drafters=1).uses_ray_actors


def test_unplaceable_reason_by_hand():
    # the case: the replica's 1 CPU + 3 shards x 0.5 + 1 drafter x 0.25 on a 2-CPU machine
    why = unplaceable_reason({"CPU": 1.0, "GPU": 0.0}, [{"CPU": 0.5}] * 3 + [{"CPU": 0.25}], 1, TWO_CPUS)
    assert why == "1 replica(s) of 2.75 CPUs each need 2.75 CPUs, the cluster has 2 CPUs"
    # the group alone exceeds every node (STRICT_PACK), though the cluster has enough in total
    nodes = [{"CPU": 2.0, "GPU": 2.0}, {"CPU": 2.0, "GPU": 2.0}]
    why = unplaceable_reason({"CPU": 0.5}, [{"CPU": 0.5, "GPU": 1.0}] * 4, 1, nodes)
    assert why == "its actors' placement group needs 4 GPUs and 2 CPUs in one node (STRICT_PACK), the largest node has 2 GPUs and 2 CPUs"
    # replicas multiply; fits exactly
    assert unplaceable_reason({"CPU": 1.0}, [], 2, TWO_CPUS) is None
    assert "3 replica(s) of 1 CPUs each need 3 CPUs" in unplaceable_reason({"CPU": 1.0}, [], 3, TWO_CPUS)


def test_check_placement_errors_on_an_owned_cluster_and_warns_on_a_joined_one(capsys):
    app = _app(num_cpus=1.0, tensor_parallel_size=3, drafters=1)
    with pytest.raises(BadInput, match=r"application 'specray' cannot be placed: .*2.75 CPUs.*the cluster has 2 CPUs"):
        check_placement([app], TWO_CPUS, owned=True)
    check_placement([app], TWO_CPUS, owned=False)
    assert "warning: application 'specray' cannot be placed" in capsys.readouterr().err
    scaled = _app(num_cpus=1.0, autoscaling=AutoscalingArgs(min_replicas=2, max_replicas=4))
    assert scaled.args.min_replicas == 2
    check_placement([scaled], TWO_CPUS, owned=True)  # 2 x 1 CPU fits
    with pytest.raises(BadInput, match="3 replica"):
        check_placement([_app(num_cpus=1.0, num_replicas=3)], TWO_CPUS, owned=True)


@pytest.mark.model
def test_tp_that_does_not_fit_the_model_fails_before_ray(default_model):
    with pytest.raises(BadInput, match=r"application 'specray': tensor_parallel_size: tp=2 does not divide num_kv_heads=3"):
        check_models([_app(tensor_parallel_size=2)])
    check_models([_app(tensor_parallel_size=3)])
