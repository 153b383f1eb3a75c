"""Async token stream over the engine: one background thread owns the engine and runs the step
loop; callers get an async iterator of RequestOutput deltas. Cancelling the iterator (a client
that went away) aborts the request and frees its KV blocks. Between steps the loop gives the heap's
free pages back to the OS every ``trim_interval_s`` (cluster/heap.py), so a long-running server's
RSS follows what it holds, not what it once held."""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from typing import AsyncIterator

from actors.sampling_params import SamplingParams
from cluster.engine import LLMEngine
from cluster.heap import HeapTrimmer
from cluster.outputs import RequestOutput

log = logging.getLogger("specray.async_engine")
_ids = itertools.count()
MAX_FAILED_STEPS = 3  # failed engine steps in a row after which the engine counts as down


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, trim_interval_s: float = 10.0):
        self.engine = engine
        self.heap = HeapTrimmer(trim_interval_s)
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self.num_failed_steps = 0  # in a row; MAX_FAILED_STEPS of them and the engine counts as down
        self._thread = threading.Thread(target=self._loop, name="specray-engine", daemon=True)
        self._thread.start()
        engine.metrics.watch_engine_loop(lambda: self.is_running)  # specray:engine_up

    async def generate(self, prompt, params: SamplingParams | None = None, chat: bool = False,
                       request_id: str | None = None, fit_max_tokens: bool = False) -> AsyncIterator[RequestOutput]:
        """Yields deltas until the final output (``finished=True``). Bad input raises ValueError
        before anything is queued (``fit_max_tokens``: see ``LLMEngine.add_request``)."""
        if self._stopped:
            raise RuntimeError("engine is shut down")
        rid = request_id or f"req-{next(_ids)}"
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        done = loop.create_future()
        self._streams[rid] = (loop, q)
        self._command(("add", rid, prompt, params or SamplingParams(), chat, fit_max_tokens, done))
        try:
            await done  # raises the engine's ValueError for bad input
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if self._streams.pop(rid, None) is not None:
                self._command(("abort", rid))

    def abort(self, request_id: str) -> None:
        self._command(("abort", request_id))

    @property
    def is_running(self) -> bool:
        """The step loop takes requests: not shut down, its thread alive, and its last steps did not
        all fail (e.g. a replica whose KV allocator actor is gone for good): a replica whose engine
        is down fails Serve's health check and is replaced."""
        return not self._stopped and self._thread.is_alive() and self.num_failed_steps < MAX_FAILED_STEPS

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> dict:
        """Unfinished requests and KV blocks (free, total; None when the blocks live elsewhere, in
        the replica's allocator actor). Read without the loop's lock: a snapshot for operators."""
        alloc = self.engine.allocator
        return {"has_unfinished": self.engine.has_unfinished(),
                "num_free_blocks": None if alloc is None else alloc.num_free_blocks,
                "num_blocks": None if alloc is None else alloc.num_blocks}

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopped = True
        self._command(("stop",))
        self._thread.join(timeout)

    # ---- engine thread ------------------------------------------------------------------
    def _command(self, cmd) -> None:
        self._commands.put(cmd)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            if not self._drain_commands():
                return
            self.heap.maybe_trim()
            if not self.engine.has_unfinished():
                self._idle()
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self.heap.note_work()
            try:
                outs = self.engine.step()
            except Exception as e:  # a broken step must not hang callers
                self.num_failed_steps += 1
                log.exception("engine step failed (%d in a row)", self.num_failed_steps)
                self._fail_all(e)
                continue
            self.num_failed_steps = 0
            for out in outs:
                self._deliver(out.request_id, out)

    def _idle(self) -> None:
        try:
            self.engine.on_idle()
        except Exception:
            log.exception("on_idle failed")

    def _drain_commands(self) -> bool:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            if cmd[0] == "stop":
                self._fail_all(RuntimeError("engine shut down"))
                return False
            if cmd[0] == "abort":
                out = self.engine.abort(cmd[1])
                if out is not None:
                    self._deliver(cmd[1], out)
            else:
                self._add(*cmd[1:])

    def _add(self, rid, prompt, params, chat, fit_max_tokens, done) -> None:
        loop = self._streams[rid][0] if rid in self._streams else None
        try:
            self.engine.add_request(rid, prompt, params, chat=chat, fit_max_tokens=fit_max_tokens)
            err = None
        except ValueError as e:
            err = e
        if loop is not None:
            loop.call_soon_threadsafe(_settle_future, done, err)

    def _deliver(self, rid: str, item) -> None:
        target = self._streams.get(rid)
        if target is not None:
            loop, q = target
            loop.call_soon_threadsafe(q.put_nowait, item)

    def _fail_all(self, err: Exception) -> None:
        for rid in list(self._streams):
            self.engine.abort(rid)
            self._deliver(rid, RuntimeError(f"request {rid} failed: {err}"))


def _settle_future(fut: asyncio.Future, err: Exception | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
