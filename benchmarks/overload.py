"""Overload: a burst of concurrent requests at once, and what every one of them is answered.

``python -m benchmarks.overload --concurrency 150`` sends ``concurrency`` chat requests at the same
moment (half streamed) to ``--url`` (a running specray server) or, without it, to a local server
it starts from ``--config`` (default ray_configs/serve_local.yaml, the configuration ``make
serve`` runs) and stops at the end; ``--rounds`` repeats the burst. Each answer is classified:

- ``200``: a completion (a stream read to its end, with no error chunk);
- ``429`` / ``503`` **OpenAI-shaped**: a JSON body ``{"error": {"message", "type", ...}}``, with a
  Retry-After header (the README's promise for overload);
- anything else is a failure: another status, a 429/503 without that body or header (e.g. a
  proxy's ``text/plain`` backpressure answer), an error chunk inside a 200 stream, a dropped
  connection.

Afterwards, at rest: KV blocks in use must be back to 0, and ``specray:http_requests_total``
must have counted every answer the client saw (so the 5xx alert sees what clients see). Exit
status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.soak import DEFAULT_CONFIG, local_server

PROMPTS = ["Name three rivers in Europe.", "Write a haiku about the sea.", "What is 17 times 23?",
           "Explain what a hash table is in two sentences.", "Translate to French: good morning, friends."]


@dataclass
class BurstResult:
    answers: Counter = field(default_factory=Counter)  # class -> count
    bad: list[str] = field(default_factory=list)  # what each failure was (first few kept)
    seconds: float = 0.0

    def fail(self, why: str) -> None:
        self.answers["failure"] += 1
        if len(self.bad) < 10:
            self.bad.append(why)


def _openai_shaped(status: int, body: bytes, headers) -> str | None:
    """None if a 429/503 answer is OpenAI-shaped with Retry-After, else what is wrong."""
    try:
        err = json.loads(body)["error"]
        if not isinstance(err.get("message"), str) or "type" not in err:
            return f"{status} error object without message/type: {body[:120]!r}"
    except (ValueError, KeyError, TypeError):
        return f"{status} not an OpenAI error body ({headers.get('Content-Type')}): {body[:120]!r}"
    if not headers.get("Retry-After"):
        return f"{status} without Retry-After"
    return None


async def _one(session, url: str, model: str, i: int, max_tokens: int, result: BurstResult) -> None:
    import aiohttp

    stream = i % 2 == 1
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            data = await r.read()
            if r.status in (429, 503):
                why = _openai_shaped(r.status, data, r.headers)
                if why is None:
                    result.answers[f"{r.status} OpenAI-shaped"] += 1
                else:
                    result.fail(why)
            elif r.status != 200:
                result.fail(f"status {r.status}: {data[:120]!r}")
            elif stream and (b'data: {"error"' in data or not data.rstrip().endswith(b"data: [DONE]")):
                result.fail(f"stream with an error chunk or no [DONE]: ...{data[-160:]!r}")
            else:
                result.answers["200"] += 1
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        result.fail(f"{type(e).__name__}: {e}")


async def burst(url: str, concurrency: int, max_tokens: int, timeout_s: float) -> BurstResult:
    import aiohttp

    result = BurstResult()
    limits = aiohttp.TCPConnector(limit=0)  # every request at once: no client-side queue
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=limits, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        async with s.get(f"{url}/v1/models") as r:
            model = (await r.json())["data"][0]["id"]  # the model the server serves
        await asyncio.gather(*(_one(s, url, model, i, max_tokens, result) for i in range(concurrency)))
    result.seconds = time.monotonic() - t0
    return result


async def _metrics(url: str) -> list:
    """The samples (name, labels, value) of the server's /metrics."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    return [sample for fam in text_string_to_metric_families(text) for sample in fam.samples]


def _sum(samples: list, name: str, route: str | None = None) -> float:
    """The sum of the samples named ``name`` (of one ``route`` label when given)."""
    return sum(s.value for s in samples if s.name == name and (route is None or s.labels.get("route") == route))


async def _at_rest(url: str, timeout_s: float = 60.0) -> list:
    """The metrics once no request runs or waits and KV blocks are back (or after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await _metrics(url)
        busy = _sum(m, "specray:num_requests_running") + _sum(m, "specray:num_requests_waiting")
        if (busy == 0 and _sum(m, "specray:kv_blocks_used") == 0) or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.5)


def run(url: str, concurrency: int, rounds: int, max_tokens: int, timeout_s: float) -> tuple[list[BurstResult], list[str]]:
    """Every round's answers and the failed at-rest checks (empty: all passed)."""
    async def go():
        before = await _metrics(url)
        results = []
        for r in range(rounds):
            results.append(await burst(url, concurrency, max_tokens, timeout_s))
            res = results[-1]
            print(f"round {r + 1}: {dict(res.answers)} in {res.seconds:.1f} s", flush=True)
            for why in res.bad:
                print(f"  failure: {why}", flush=True)
        after = await _at_rest(url)
        return before, results, after

    before, results, after = asyncio.run(go())
    problems = []
    leaked = _sum(after, "specray:kv_blocks_used")
    if leaked:
        problems.append(f"{leaked:.0f} KV blocks still in use at rest")
    route = "/v1/chat/completions"
    counted = _sum(after, "specray:http_requests_total", route) - _sum(before, "specray:http_requests_total", route)
    seen = sum(sum(r.answers.values()) for r in results)
    if counted != seen:
        problems.append(f"specray:http_requests_total counted {counted:.0f} chat answers, the client saw {seen}")
    return results, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overload", description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server (default: start one from --config)")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="Serve config file of the local server")
    ap.add_argument("--concurrency", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    args = ap.parse_args(argv)
    for flag in ("concurrency", "rounds", "max_tokens"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")

    def report(url: str) -> int:
        results, problems = run(url, args.concurrency, args.rounds, args.max_tokens, args.timeout)
        total = sum((r.answers for r in results), Counter())
        print(f"\n{args.rounds} bursts of {args.concurrency} concurrent chat requests ({url}): {dict(total)}")
        for p in problems:
            print(f"FAILED: {p}")
        ok = not problems and not total["failure"]
        print("every answer was 200 or an OpenAI-shaped 429/503" if ok else "FAILED: see above")
        return 0 if ok else 1

    if args.url:
        return report(args.url.rstrip("/"))
    if not Path(args.config).is_file():
        print(f"overload: error: --config {args.config!r} does not exist", file=sys.stderr)
        return 2
    with local_server(args.config) as url:
        return report(url)


if __name__ == "__main__":
    raise SystemExit(main())
