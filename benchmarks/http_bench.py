"""HTTP backend of the sweep: streaming chat completions against an OpenAI-compatible endpoint
(``--url``) through the ``openai`` async client, ``concurrency`` closed-loop clients in parallel.

The method name is the model the server reports (GET /v1/models). The baseline of the same run is
the same server with speculation switched off per request (``spec_tokens: 0``, specray's request
extension; a server that ignores unknown fields would speculate in both, which shows as a 1.0x
speedup). Times are taken here, on the client: TTFT at the first chunk carrying text, E2E at the
end of the stream. Output tokens and speculation counters come from the final usage chunk
(``stream_options.include_usage``; specray adds a ``speculation`` object to it); without usage
the text chunks are counted.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.prompt_set import BenchPrompt
from benchmarks.results import BASELINE, RequestRecord, Run, Variant
from benchmarks.sweep import RunOnce, request_seed

CONNECT_TIMEOUT_S = 10.0


class HttpBackend:
    def __init__(self, url: str, max_tokens: int | None, seed: int | None = 0, warmup: int = 1,
                 request_timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.max_tokens, self.seed, self.warmup, self.timeout = max_tokens, seed, warmup, request_timeout_s
        self.server_model = asyncio.run(self._server_model())

    def _client(self, timeout: float):
        from openai import AsyncOpenAI

        base = self.url if self.url.endswith("/v1") else f"{self.url}/v1"
        return AsyncOpenAI(base_url=base, api_key="specray-bench", max_retries=0, timeout=timeout)

    async def _server_model(self) -> str:
        import openai

        try:
            async with self._client(CONNECT_TIMEOUT_S) as client:
                models = await client.models.list()
        except openai.APIConnectionError as e:
            raise ValueError(f"--url {self.url}: unreachable ({_cause(e)})") from None
        except openai.APIStatusError as e:
            raise ValueError(f"--url {self.url}: GET /v1/models answered {e.status_code}") from None
        if not models.data:
            raise ValueError(f"--url {self.url}: GET /v1/models lists no model")
        return models.data[0].id

    @contextmanager
    def session(self, method: str, variants: tuple[Variant, ...], warmup_prompt: BenchPrompt) -> Iterator[RunOnce]:
        for _ in range(self.warmup):
            run = self._run(method, variants[0], [warmup_prompt], 1, 0.0, max_tokens=8)
            if run.records[0].error:
                raise ValueError(f"--url {self.url}: warm-up request failed: {run.records[0].error}")
        yield lambda v, prompts, c, t: self._run(method, v, prompts, c, t)

    def _run(self, method: str, variant: Variant, prompts: list[BenchPrompt], concurrency: int,
             temperature: float, max_tokens: int | None = None) -> Run:
        spec = 0 if method == BASELINE else (None if variant.adaptive else variant.spec_tokens)
        start = time.perf_counter()
        records = asyncio.run(self._serve(prompts, concurrency, temperature, spec, max_tokens))
        return Run(method, variant, temperature, concurrency, time.perf_counter() - start, records)

    async def _serve(self, prompts: list[BenchPrompt], concurrency: int, temperature: float,
                     spec_tokens: int | None, max_tokens: int | None) -> list[RequestRecord]:
        records: list[RequestRecord | None] = [None] * len(prompts)
        todo = iter(range(len(prompts)))

        async def client_loop(client) -> None:
            for i in todo:  # shared iterator: each closed-loop client takes the next prompt when free
                budget = max_tokens or prompts[i].budget(self.max_tokens)
                records[i] = await self._one(client, prompts[i], budget, temperature,
                                             request_seed(self.seed, i, temperature), spec_tokens)

        async with self._client(self.timeout) as client:
            await asyncio.gather(*(client_loop(client) for _ in range(min(concurrency, len(prompts)))))
        return [r for r in records if r is not None]

    async def _one(self, client, p: BenchPrompt, max_tokens: int, temperature: float, seed: int | None,
                   spec_tokens: int | None) -> RequestRecord:
        import openai

        extra = {} if spec_tokens is None else {"spec_tokens": spec_tokens}
        start = time.perf_counter()
        first, chunks, usage, spec = None, 0, None, None
        try:
            stream = await client.chat.completions.create(
                model=self.server_model, messages=p.messages, max_tokens=max_tokens, temperature=temperature,
                seed=seed, stream=True, stream_options={"include_usage": True}, extra_body=extra)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    chunks += 1
                if chunk.usage is not None:
                    usage, spec = chunk.usage, (chunk.model_extra or {}).get("speculation")
        except openai.OpenAIError as e:
            return RequestRecord(p.category, 0, time.perf_counter() - start, None, error=_cause(e))
        end = time.perf_counter()
        spec = spec or {}
        return RequestRecord(p.category, usage.completion_tokens if usage else chunks, end - start,
                             None if first is None else first - start, spec.get("num_drafts", 0),
                             spec.get("num_draft_tokens", 0), spec.get("num_accepted_tokens", 0),
                             list(spec.get("accepted_per_pos", [])))


def _cause(e: BaseException) -> str:
    """The innermost reason (e.g. 'Connection refused'), one line."""
    while e.__cause__ is not None:
        e = e.__cause__
    return (str(e) or type(e).__name__).splitlines()[0]
