"""A whole replica on Ray (scheduler actor + KV allocator actor + TP verifier shards + drafter
workers), as `specray generate --ray` runs it: same greedy output as the in-process engine, and a
verifier rank killed mid-generation loses no request."""
from __future__ import annotations

import asyncio
import json

import pytest

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.replica import RayOptions, RayReplicaClient

pytestmark = [pytest.mark.ray, pytest.mark.model]

PROMPTS = [[{"role": "user", "content": t}] for t in
           ("Name three colours.", "What is 2 + 2? Explain.", "Write a haiku about rain.")]
TOKENS = 16


@pytest.fixture(scope="module")
def local_outputs(default_model):
    from cluster.engine import LLMEngine

    eng = LLMEngine(EngineConfig(num_kv_blocks=256, num_threads=1), loaded=default_model)
    return [o.token_ids for o in eng.generate(PROMPTS, SamplingParams(max_tokens=TOKENS), chat=True)]


def _config(draft="none", k=4):
    return EngineConfig(num_kv_blocks=256, speculative=SpeculativeConfig.from_draft_arg(draft, k, adaptive=False))


def test_replica_with_merged_drafters_matches_in_process(ray_cluster, local_outputs, default_model_dir):
    # two drafter workers (the target itself as a draft model + n-gram lookup), trees merged
    client = RayReplicaClient(_config(str(default_model_dir)), RayOptions(tp=1, drafters=2))
    try:
        outs = client.generate_all(PROMPTS, [SamplingParams(max_tokens=TOKENS)] * len(PROMPTS), True, None)
        assert [o.token_ids for o in outs] == local_outputs
        assert all(o.finished for o in outs)
        stats = client.stats()
        assert stats["kv"]["num_free_blocks"] == stats["kv"]["num_blocks"]  # no leak in the global allocator
        assert stats["proposer_failures"] == 0
        assert stats["proposer"]["num_workers"] == 2 and stats["proposer"]["num_failed_steps"] == 0
        assert sum(o.num_accepted_tokens for o in outs) > 0
    finally:
        client.shutdown()


def _stream_killing(client, kill, tag: str) -> list[list[int]]:
    """Stream every prompt; once a stream has 4 tokens, ``kill()`` one of the replica's actors.
    -> the tokens each stream delivered."""
    params = SamplingParams(max_tokens=TOKENS)

    async def run():
        streams = [client.stream(p, params, True, f"{tag}{i}") for i, p in enumerate(PROMPTS)]
        got = {i: [] for i in range(len(PROMPTS))}
        killed = False

        async def drain(i, gen):
            nonlocal killed
            async for out in gen:
                got[i] += out.delta_token_ids
                if not killed and len(got[i]) >= 4:
                    killed = True
                    kill()
        await asyncio.wait_for(asyncio.gather(*(drain(i, g) for i, g in enumerate(streams))), timeout=240)
        return [got[i] for i in range(len(PROMPTS))]

    return asyncio.run(run())


def test_killed_verifier_rank_restarts_group_and_requeues(ray_cluster, local_outputs):
    client = RayReplicaClient(_config("layerskip:4", 3), RayOptions(tp=1))
    try:
        streamed = _stream_killing(client, lambda: ray_cluster.kill(
            ray_cluster.get(client.actor.verifier_actors.remote())[0]), "k")
        assert streamed == local_outputs  # nothing lost, nothing duplicated in the streams
        assert client.stats()["verifier_restarts"] >= 1
    finally:
        client.shutdown()


def test_killed_kv_allocator_is_replaced_and_requests_requeue(ray_cluster, local_outputs):
    client = RayReplicaClient(_config("ngram", 3), RayOptions(tp=1))
    params = SamplingParams(max_tokens=TOKENS)
    try:
        streamed = _stream_killing(client, lambda: ray_cluster.kill(ray_cluster.get(client.actor.kv_actor.remote())),
                                   "kv")
        assert streamed == local_outputs  # nothing lost, nothing duplicated in the streams
        stats = client.stats()
        assert stats["kv_restarts"] == 1
        assert stats["kv"]["num_free_blocks"] == stats["kv"]["num_blocks"]  # the fresh allocator leaks nothing
        # and the replica serves new requests
        outs = client.generate_all(PROMPTS[:1], [params], True, None)
        assert [o.token_ids for o in outs] == local_outputs[:1]
    finally:
        client.shutdown()


def test_cli_generate_ray_json(ray_cluster, capsys, tmp_path, local_outputs):
    from cluster.cli import main

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in PROMPTS))
    code = main(["generate", "--ray", "--tp", "1", "--drafters", "1", "--draft", "ngram", "--chat", "--json",
                 "--max-tokens", str(TOKENS), "--prompts-file", str(f)])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["token_ids"] for r in rows] == local_outputs


def test_cli_ray_rejects_tp_that_does_not_divide_kv_heads(capsys):
    from cluster.cli import main

    code = main(["generate", "hi", "--ray", "--tp", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert "tp=2 does not divide num_kv_heads=3" in err and "use tp in [1, 3]" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_dead_scheduler_gives_callers_a_clear_error(ray_cluster):
    client = RayReplicaClient(_config(), RayOptions(tp=1))
    params = SamplingParams(max_tokens=400, ignore_eos=True)

    async def run():
        async for out in client.stream(PROMPTS[0], params, True, "victim"):
            if len(out.token_ids) >= 2:
                ray_cluster.kill(client.actor, no_restart=False)  # Ray restarts it; the request is lost

    try:
        with pytest.raises(Exception) as info:
            asyncio.run(asyncio.wait_for(run(), timeout=120))
        assert "scheduler of this replica died" in str(info.value)
    finally:
        ray_cluster.kill(client.actor)


def test_drafter_that_fails_to_load(ray_cluster, tmp_path):
    bogus = str(tmp_path / "no-such-draft")
    with pytest.raises(ValueError, match="no-such-draft"):
        RayReplicaClient(_config(bogus), RayOptions(tp=1, drafters=1))
    client = RayReplicaClient(_config(bogus), RayOptions(tp=1, drafters=1, allow_no_spec=True))
    try:
        outs = client.generate_all(PROMPTS[:1], [SamplingParams(max_tokens=4)], True, None)
        assert outs[0].finished and outs[0].num_draft_tokens == 0
    finally:
        client.shutdown()
