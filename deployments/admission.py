"""Admission control of one replica: overload is answered at once, never left to hang.

At most ``max_running`` engine sequences run (a request with ``n`` choices counts ``n``); up to
``max_waiting`` more requests wait, first come first served, at most ``wait_timeout_s``; anything
beyond is refused with 429 and a Retry-After. Protocol-neutral (``APIError``), so the HTTP and gRPC
ingresses share it through ``OpenAIServer.handle``.
"""
from __future__ import annotations

import asyncio
from collections import deque

from deployments.openai_api import APIError


class Ticket:
    """Room for ``n`` sequences; ``release()`` gives it back (idempotent, so every exit path may call it)."""

    def __init__(self, admission: Admission, n: int):
        self._admission, self.n = admission, n

    def release(self) -> None:
        if self._admission is not None:
            admission, self._admission = self._admission, None
            admission._release(self.n)


class Admission:
    def __init__(self, max_running: int, max_waiting: int, retry_after_s: int, wait_timeout_s: float):
        self.max_running, self.max_waiting = max_running, max_waiting
        self.retry_after_s, self.wait_timeout_s = retry_after_s, wait_timeout_s
        self.running = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    async def admit(self, n: int) -> Ticket:
        """Room for ``n`` sequences now, or after a wait in line; APIError 429 when the line is full
        or the wait runs out, 400 when ``n`` alone exceeds the replica."""
        if n > self.max_running:
            raise APIError(400, f"n={n}: this server runs at most {self.max_running} sequences at once "
                                f"(max_ongoing_requests); ask for fewer choices", param="n")
        if not self._waiting and self.running + n <= self.max_running:
            self.running += n
            return Ticket(self, n)
        if len(self._waiting) >= self.max_waiting:
            raise self._overloaded(f"{self.running} sequences running (max_ongoing_requests={self.max_running}) "
                                   f"and {len(self._waiting)} requests waiting (max_queued_requests="
                                   f"{self.max_waiting})")
        fut = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_timeout_s)
        except asyncio.TimeoutError:
            if not fut.done():  # (room may have come just as the wait ran out: then it is taken)
                self._leave_line(entry)
                raise self._overloaded(f"waited {self.wait_timeout_s:g}s in line without room") from None
        except asyncio.CancelledError:  # the client went away while waiting
            if fut.done():
                self._release(n)
            else:
                self._leave_line(entry)
            raise
        return Ticket(self, n)

    def _leave_line(self, entry: tuple[int, asyncio.Future]) -> None:
        entry[1].cancel()
        self._waiting.remove(entry)
        self._wake()  # a smaller request behind this one may fit now

    def _overloaded(self, why: str) -> APIError:
        return APIError(429, f"server is at capacity: {why}; retry after {self.retry_after_s}s",
                        code="server_overloaded", retry_after_s=self.retry_after_s)

    def _release(self, n: int) -> None:
        self.running -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.running + self._waiting[0][0] <= self.max_running:
            n, fut = self._waiting.popleft()
            self.running += n
            fut.set_result(None)
