"""The async token stream: deltas add up to the final output, cancellation aborts and frees KV."""
from __future__ import annotations

import asyncio

import pytest

from actors.sampling_params import SamplingParams
from cluster.async_engine import AsyncLLMEngine
from tests.tiny import random_prompts, tiny_engine


@pytest.fixture(scope="module")
def target_dir(tiny_model_dir):
    return tiny_model_dir("llama", seed=0, tie_word_embeddings=False)


def test_stream_deltas_add_up_to_generate(target_dir):
    prompts = random_prompts(3, seed=11)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in tiny_engine(target_dir).generate(prompts, params)]
    aeng = AsyncLLMEngine(tiny_engine(target_dir, draft="ngram", k=3))

    async def one(p):
        ids, last = [], None
        async for out in aeng.generate(p, params):
            ids += out.delta_token_ids
            last = out
        assert last.finished and last.token_ids == ids
        return ids

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    try:
        assert asyncio.run(main()) == want
    finally:
        aeng.shutdown()


def test_cancel_aborts_and_frees_blocks(target_dir):
    eng = tiny_engine(target_dir)
    aeng = AsyncLLMEngine(eng)

    async def main():
        gen = aeng.generate(random_prompts(1, seed=2)[0], SamplingParams(max_tokens=500, ignore_eos=True))
        async for out in gen:
            if len(out.token_ids) >= 3:
                break
        await gen.aclose()
        for _ in range(200):
            if not eng.has_unfinished():
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
        assert not eng.has_unfinished()
        assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    finally:
        aeng.shutdown()


def test_bad_request_raises_and_engine_keeps_serving(target_dir):
    aeng = AsyncLLMEngine(tiny_engine(target_dir, max_model_len=32))

    async def main():
        with pytest.raises(ValueError, match="context"):
            async for _ in aeng.generate(list(range(3, 60)), SamplingParams(max_tokens=4)):
                pass
        outs = [o async for o in aeng.generate([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))]
        return outs[-1]

    try:
        last = asyncio.run(main())
        assert last.finished and len(last.token_ids) == 4
    finally:
        aeng.shutdown()


def test_engine_whose_steps_keep_failing_counts_as_down(target_dir):
    """Requests of a failed step get the error (no hang); MAX_FAILED_STEPS failures in a row mark the
    engine down (Serve's health check and specray:engine_up read is_running); a good step clears it."""
    from cluster.async_engine import MAX_FAILED_STEPS

    eng = tiny_engine(target_dir)
    step, broken = eng.step, [True]

    def flaky_step():
        if broken[0]:
            raise RuntimeError("KV allocator actor died")
        return step()

    eng.step = flaky_step
    aeng = AsyncLLMEngine(eng)
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def one(p):
        return [o async for o in aeng.generate(p, params)]

    try:
        for i in range(MAX_FAILED_STEPS):
            assert aeng.is_running, f"down after only {i} failed steps"
            with pytest.raises(RuntimeError, match="KV allocator actor died"):
                asyncio.run(one(random_prompts(1, seed=i)[0]))
        assert not aeng.is_running
        from prometheus_client import generate_latest

        assert "specray:engine_up 0.0" in generate_latest(eng.metrics.registry).decode()
        broken[0] = False
        outs = asyncio.run(one(random_prompts(1, seed=9)[0]))  # an operator's request still runs
        assert outs[-1].finished and aeng.is_running
    finally:
        aeng.shutdown()
