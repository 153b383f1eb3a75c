"""A Serve replica whose engine runs over Ray actors (verifier shard group + drafter worker), the
shape serve_4xa100.yaml deploys with tensor_parallel_size=4: same greedy text as the in-process
engine, and deleting the app releases the actors it started."""
from __future__ import annotations

import time

import pytest
import requests

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from deployments.serve_config import ServeArgs
from tests.ports import free_port

pytestmark = [pytest.mark.ray, pytest.mark.model]

PROMPT = "The capital of France is"


def _engine_config() -> EngineConfig:
    return EngineConfig(num_kv_blocks=128, num_threads=1, speculative=SpeculativeConfig.from_draft_arg("ngram", 4))


def test_serve_args_reject_gpus_on_the_step_loop_replica():
    with pytest.raises(ValueError, match="num_gpus=1.0 with tensor_parallel_size=4"):
        ServeArgs(tensor_parallel_size=4, num_gpus=1)


def test_replica_over_shard_and_drafter_actors_matches_in_process(ray_cluster, default_model):
    from ray import serve

    from cluster.engine import LLMEngine
    from deployments.app import build_app

    ref = LLMEngine(_engine_config(), loaded=default_model).generate([PROMPT], SamplingParams(max_tokens=12))[0]
    before = set(ray_cluster.util.placement_group_table())
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        args = ServeArgs(engine=_engine_config(), tensor_parallel_size=1, drafters=1, num_cpus=0.25)
        serve.run(build_app(args), name="specray-ray-replica", route_prefix="/")
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                          json={"prompt": PROMPT, "max_tokens": 12})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == ref.text
        assert body["usage"]["completion_tokens"] == ref.num_output_tokens
        mine = _created_placement_groups(before)
        assert len(mine) == 1, mine  # the replica's group: verifier rank + drafter bundles
        serve.delete("specray-ray-replica")
        deadline = time.monotonic() + 60
        while _created_placement_groups(before) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _created_placement_groups(before), "the replica left its placement group behind"
    finally:
        serve.shutdown()


def _created_placement_groups(before: set) -> list[str]:
    """Placement groups created since ``before`` that are still held."""
    import ray

    return [pg for pg, info in ray.util.placement_group_table().items()
            if pg not in before and info["state"] != "REMOVED"]
