"""Soak: minutes of mixed traffic against a server, watching for what only time shows.

``python -m benchmarks.soak --minutes 30 --concurrency 32`` runs ``concurrency`` closed-loop clients
for ``minutes`` against ``--url`` (a running specray server) or, without it, a local server that it
starts from ``--config`` (default ray_configs/serve_local.yaml, on a free port, no gRPC) and stops
at the end. The traffic: chat and completions, streamed or not, a temperature mix (greedy, 0.7 and
1.0, seeded or not, some with top_p, stop strings, logprobs or n=2), a fraction of streams that the
client closes after a few chunks (``--cancel``) and a fraction of bad requests (``--bad``: malformed
JSON, wrong types, an unknown model, too many choices, token ids outside the vocabulary, an empty
prompt) interleaved. A fixed greedy request is repeated every ``--greedy-every`` seconds, the first
time alone before the load: its text must never change.

Every ``--report-every`` seconds one line: answers by status, cancelled streams, the replica's RSS
(``specray:process_resident_memory_bytes`` from /metrics: the replica process, the sum of all
replicas when there are several), KV blocks in use, requests running and waiting. At the end,
once the server is at rest: the 5xx count (and error chunks inside streams), leaked KV blocks
(``specray:kv_blocks_used`` at rest), whether every greedy check was identical, and the RSS growth
after the warm-up (``--warmup`` minutes, default a fifth of the run and at most 5). Exit status 1
when a check fails: a 5xx or error chunk, a leaked block, a changed greedy text, or RSS growth after
the warm-up above ``--max-rss-growth`` (when given).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.ports import free_port

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "ray_configs" / "serve_local.yaml"
GREEDY = {"prompt": "The three primary colours are", "max_tokens": 32, "temperature": 0.0}
PROMPTS = ("Write a short poem about the sea.", "Explain what a hash table is in two sentences.",
           "List five fruits and their colours:", "Once upon a time, in a small village,",
           "def fibonacci(n):", "Translate to French: I like cheese and bread.",
           "What is the capital of Japan? Answer in one word.", "Count from 1 to 20:")
BAD = (  # (route, body): requests every server must refuse with a 4xx, never a 5xx
    ("completions", b'{"prompt": "hi", "max_tokens": '),
    ("completions", {"prompt": "hi", "max_tokens": -3}),
    ("completions", {"prompt": "hi", "temperature": "hot"}),
    ("chat/completions", {"messages": "hello"}),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "no-such-model"}),
    ("completions", {"prompt": "hi", "n": 1000}),
    ("completions", {"prompt": [10 ** 9], "max_tokens": 2}),
    ("completions", {"prompt": "", "max_tokens": 2}),
)


@dataclass
class SoakOptions:
    minutes: float = 5.0
    concurrency: int = 8
    cancel: float = 0.2  # fraction of streams closed by the client after a few chunks
    bad: float = 0.05  # fraction of bad requests
    warmup_minutes: float | None = None  # None: a fifth of the run, at most 5 minutes
    report_every_s: float = 30.0
    greedy_every_s: float = 30.0
    max_tokens: int = 64
    seed: int = 0
    api_key: str | None = None

    @property
    def warmup_s(self) -> float:
        return 60 * (self.warmup_minutes if self.warmup_minutes is not None else min(5.0, self.minutes / 5))


@dataclass
class Sample:
    t: float  # seconds since the load began
    rss: float | None  # bytes
    kv_used: float | None
    running: float
    waiting: float
    answered: int


@dataclass
class SoakResult:
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> answers (all requests)
    bad_statuses: Counter = field(default_factory=Counter)  # the bad requests' statuses
    cancelled: int = 0
    stream_errors: int = 0  # error chunks inside 200 streams
    client_errors: Counter = field(default_factory=Counter)  # connection errors, timeouts
    greedy: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    warm: Sample | None = None  # the first sample at or after the warm-up
    rest: Sample | None = None  # the server at rest after the load
    leaked_blocks: float | None = None

    @property
    def num_5xx(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    @property
    def greedy_identical(self) -> bool:
        return len(self.greedy) >= 1 and len(set(self.greedy)) == 1

    def rss_growth(self) -> float | None:
        """Largest RSS after the warm-up (at rest included) over the RSS at the warm-up, minus 1."""
        rest = [self.rest] if self.rest is not None else []
        after = [s.rss for s in self.samples + rest if self.warm is not None and s.t >= self.warm.t and s.rss]
        if not after or not self.warm.rss:
            return None
        return max(after) / self.warm.rss - 1

    def failures(self, max_rss_growth: float | None = None) -> list[str]:
        out = []
        if self.num_5xx or self.stream_errors:
            out.append(f"{self.num_5xx} 5xx answers, {self.stream_errors} error chunks in streams")
        if self.leaked_blocks is None or self.leaked_blocks:
            out.append(f"KV blocks in use at rest: {self.leaked_blocks}")
        if not self.greedy_identical:
            out.append(f"greedy texts differ: {len(set(self.greedy))} distinct of {len(self.greedy)}")
        growth = self.rss_growth()
        if max_rss_growth is not None and (growth is None or growth > max_rss_growth):
            out.append(f"RSS growth after warm-up {growth} above {max_rss_growth}")
        bad_5xx = sum(n for s, n in self.bad_statuses.items() if not 400 <= s < 500)
        if bad_5xx:
            out.append(f"{bad_5xx} bad requests not answered 4xx: {dict(self.bad_statuses)}")
        return out


class Soak:
    def __init__(self, url: str, opts: SoakOptions):
        self.base, self.opts = url.rstrip("/").removesuffix("/v1"), opts
        self.headers = {"Content-Type": "application/json"}
        if opts.api_key:
            self.headers["Authorization"] = f"Bearer {opts.api_key}"
        self.result = SoakResult()
        self.model: str | None = None
        self.session = None

    async def run(self) -> SoakResult:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as self.session:
            async with self.session.get(f"{self.base}/v1/models", headers=self.headers) as r:
                self.model = (await r.json())["data"][0]["id"]
            await self._greedy_check()  # alone, before the load
            t0 = time.monotonic()
            deadline, stop = t0 + 60 * self.opts.minutes, asyncio.Event()
            monitor = asyncio.create_task(self._monitor(t0, stop))
            greedy = asyncio.create_task(self._greedy_loop(deadline))
            await asyncio.gather(*(self._client(random.Random(self.opts.seed * 1000 + i), deadline)
                                   for i in range(self.opts.concurrency)), greedy)
            stop.set()
            await monitor
            self.result.rest = await self._at_rest(t0)
            self.result.leaked_blocks = self.result.rest.kv_used
            _print_sample(self.result.rest, self.result, "at rest")
        return self.result

    # ---- traffic ----------------------------------------------------------------------------
    async def _client(self, rng: random.Random, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if rng.random() < self.opts.bad:
                    route, body = rng.choice(BAD)
                    status, _ = await self._send(route, body, rng)
                    self.result.bad_statuses[status] += 1
                else:
                    route, body = self._request(rng)
                    status, retry = await self._send(route, body, rng)
                    if status == 429:
                        await asyncio.sleep(min(retry, 1.0))
            except Exception as e:  # connection refused, reset, timeout: counted, never fatal
                self.result.client_errors[type(e).__name__] += 1
                await asyncio.sleep(0.2)

    def _request(self, rng: random.Random) -> tuple[str, dict]:
        temperature = rng.choice((0.0, 0.0, 0.7, 1.0))
        body: dict = {"model": self.model, "max_tokens": rng.randint(8, self.opts.max_tokens),
                      "temperature": temperature, "stream": rng.random() < 0.6}
        if temperature and rng.random() < 0.5:
            body["seed"] = rng.randrange(1 << 30)
        if temperature and rng.random() < 0.3:
            body["top_p"] = 0.9
        if temperature and rng.random() < 0.05:
            body["n"] = 2
        if rng.random() < 0.2:
            body["stop"] = ["\n\n"]
        if body["stream"] and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        chat = rng.random() < 0.5
        prompt = rng.choice(PROMPTS) + ("" if rng.random() < 0.5 else f" ({rng.randrange(1000)})")
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
            if rng.random() < 0.1:
                body.update(logprobs=True, top_logprobs=2)
        else:
            body["prompt"] = prompt
            if rng.random() < 0.1:
                body["logprobs"] = 2
        return ("chat/completions" if chat else "completions"), body

    async def _send(self, route: str, body, rng: random.Random | None = None) -> tuple[int, float]:
        """POST ``body``; a stream is read to its end, or closed after a few chunks for a fraction of
        them. Returns (status, Retry-After seconds)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        stream = isinstance(body, dict) and body.get("stream")
        cancel_after = rng.randint(1, 4) if stream and rng is not None and rng.random() < self.opts.cancel else None
        async with self.session.post(f"{self.base}/v1/{route}", data=data, headers=self.headers) as r:
            self.result.statuses[r.status] += 1
            retry = float(r.headers.get("Retry-After", 0) or 0)
            if r.status != 200 or not stream:
                await r.read()
                return r.status, retry
            chunks = 0
            async for line in r.content:
                if line.startswith(b'data: {"error"'):
                    self.result.stream_errors += 1
                elif line.startswith(b"data: {"):
                    chunks += 1
                    if cancel_after is not None and chunks >= cancel_after:
                        r.close()  # the client goes away mid-stream: the server must abort and free
                        self.result.cancelled += 1
                        break
            return r.status, retry

    async def _greedy_loop(self, deadline: float) -> None:
        while time.monotonic() + self.opts.greedy_every_s < deadline:
            await asyncio.sleep(self.opts.greedy_every_s)
            await self._greedy_check()

    async def _greedy_check(self) -> None:
        body = json.dumps({"model": self.model, **GREEDY}).encode()
        for _ in range(60):  # an overloaded server may say 429: try again
            async with self.session.post(f"{self.base}/v1/completions", data=body, headers=self.headers) as r:
                if r.status == 429:
                    await asyncio.sleep(1.0)
                    continue
                self.result.statuses[r.status] += 1
                text = await r.text()
                self.result.greedy.append(json.loads(text)["choices"][0]["text"] if r.status == 200
                                          else f"HTTP {r.status}: {text[:200]}")
                return
        self.result.greedy.append("429 for a minute")

    # ---- what the server shows -------------------------------------------------------------
    async def _monitor(self, t0: float, stop: asyncio.Event) -> None:
        while True:
            sample = await self._sample(t0)
            self.result.samples.append(sample)
            if self.result.warm is None and sample.t >= self.opts.warmup_s and sample.rss:
                self.result.warm = sample
            _print_sample(sample, self.result)
            try:
                await asyncio.wait_for(stop.wait(), self.opts.report_every_s)
                return
            except asyncio.TimeoutError:
                continue

    async def _sample(self, t0: float) -> Sample:
        from prometheus_client.parser import text_string_to_metric_families

        async with self.session.get(f"{self.base}/metrics") as r:
            text = await r.text()
        values = {fam.name: fam.samples[0].value for fam in text_string_to_metric_families(text) if fam.samples}
        p = "specray:"
        return Sample(time.monotonic() - t0, values.get(p + "process_resident_memory_bytes"),
                      values.get(p + "kv_blocks_used"), values.get(p + "num_requests_running", 0.0),
                      values.get(p + "num_requests_waiting", 0.0), sum(self.result.statuses.values()))

    async def _at_rest(self, t0: float, timeout_s: float = 60.0) -> Sample:
        """The server once nothing runs or waits and no KV block is in use (or after ``timeout_s``)."""
        end = time.monotonic() + timeout_s
        while True:
            s = await self._sample(t0)
            if (s.running == s.waiting == 0 and not s.kv_used) or time.monotonic() > end:
                return s
            await asyncio.sleep(0.5)


def _mb(v: float | None) -> str:
    return "?" if v is None else f"{v / 2**20:.0f} MB"


def _print_sample(s: Sample, res: SoakResult, label: str = "") -> None:
    growth = ""
    if res.warm is not None and s.rss and res.warm.rss:
        growth = f" ({100 * (s.rss / res.warm.rss - 1):+.1f}% vs warm-up)"
    by_status = " ".join(f"{k}:{v}" for k, v in sorted(res.statuses.items()))
    print(f"[{s.t:7.0f}s] {label or 'answers'} {s.answered} ({by_status}) cancelled {res.cancelled} "
          f"rss {_mb(s.rss)}{growth} kv_used {s.kv_used} running {s.running:.0f} waiting {s.waiting:.0f}",
          flush=True)


def summary(res: SoakResult, opts: SoakOptions, url: str) -> str:
    first = next((s for s in res.samples if s.rss), None)
    growth = res.rss_growth()
    peak = max((s.rss for s in res.samples + ([res.rest] if res.rest else []) if s.rss), default=None)
    lines = [
        f"soak: {opts.minutes:g} min at concurrency {opts.concurrency} against {url} "
        f"(cancel {opts.cancel:g}, bad {opts.bad:g}); {sum(res.statuses.values())} answers "
        f"{dict(sorted(res.statuses.items()))}, {res.cancelled} streams cancelled, "
        f"client errors {dict(res.client_errors) or 0}",
        f"5xx: {res.num_5xx}; error chunks in streams: {res.stream_errors}; bad requests by status: "
        f"{dict(sorted(res.bad_statuses.items()))}",
        f"RSS: first {_mb(first.rss if first else None)}, at warm-up ({res.warm.t:.0f} s) "
        f"{_mb(res.warm.rss)}, peak {_mb(peak)}, at rest {_mb(res.rest.rss if res.rest else None)}; "
        f"growth after warm-up {'?' if growth is None else f'{100 * growth:+.1f}%'}"
        if res.warm is not None else f"RSS: first {_mb(first.rss if first else None)} (run ended before the warm-up)",
        f"KV blocks in use at rest: {res.leaked_blocks} (leaked)",
        f"greedy check: {res.greedy.count(res.greedy[0]) if res.greedy else 0}/{len(res.greedy)} identical",
    ]
    return "\n".join(lines)


def run_soak(url: str, opts: SoakOptions) -> SoakResult:
    return asyncio.run(Soak(url, opts).run())


# ---- a local server for the run -------------------------------------------------------------
@contextmanager
def local_server(config: str | Path) -> Iterator[str]:
    """The first application of Serve config file ``config`` on a new local Ray instance, HTTP on a
    free 127.0.0.1 port (no gRPC); Serve and Ray stopped at the end."""
    import ray
    from ray import serve

    from cluster.serve_config_file import load_serve_file

    app = load_serve_file(config).apps[0]  # validated before Ray starts
    port = free_port()
    ray.init(address="local", include_dashboard=False, log_to_driver=False, namespace="specray-soak")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app.app, name=app.name, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one from --config)")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="Serve config file of the local server")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cancel", type=float, default=0.2, help="fraction of streams closed early")
    ap.add_argument("--bad", type=float, default=0.05, help="fraction of bad requests")
    ap.add_argument("--warmup", type=float, default=None, help="minutes (default: a fifth of the run, <= 5)")
    ap.add_argument("--report-every", type=float, default=30.0, help="seconds between report lines")
    ap.add_argument("--greedy-every", type=float, default=30.0, help="seconds between greedy checks")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--api-key")
    ap.add_argument("--max-rss-growth", type=float, default=None,
                    help="fail when RSS after the warm-up grows more than this fraction (e.g. 0.05)")
    a = ap.parse_args(argv)
    opts = SoakOptions(a.minutes, a.concurrency, a.cancel, a.bad, a.warmup, a.report_every, a.greedy_every,
                       a.max_tokens, a.seed, a.api_key)
    if a.url:
        res, url = run_soak(a.url, opts), a.url
    else:
        with local_server(a.config) as url:
            res = run_soak(url, opts)
    print(summary(res, opts, url))
    failed = res.failures(a.max_rss_growth)
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
