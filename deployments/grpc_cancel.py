"""Registers ``specray.v1.Generation`` on Serve's gRPC proxy so that a cancelled stream always stops
its request on the replica.

Serve's proxy (Ray 2.60) cancels the replica's generator only when the client's cancel lands while
the proxy is awaiting the replica's next item. A cancel that lands while the proxy is still writing
the previous item to the client is raised in gRPC's write, outside the proxy's generator, and the
request runs on to ``max_tokens`` holding its KV blocks and an admission place (3 of 15 streams
cancelled right after their first chunk did so; none when the cancel came 0.3 s later).

``add_generation_servicer`` is the ``grpc_servicer_functions`` entry; Serve calls it in the proxy
process with the proxy's server. Before registering the service it wraps the server's handler
factory so that each server-streaming call reads the proxy's stream in a task of its own (the pump)
and the call's done callback, which gRPC runs on every end of the call (a client cancel included),
cancels the pump. The pump only ever waits on the replica's next item, so the cancel always lands
where the proxy turns it into a cancel of the replica's generator. The proxy's code that runs after
the cancel (its status and access log) gets a ``CallContext``: gRPC's own context must not be
touched once the call has ended (``peer()`` on an ended call crashed the proxy process).

A cancelled call also left an ERROR traceback in the proxy's log ("Task exception was never
retrieved ... RequestCancelledError"): Serve's proxy waits on the replica's next item in a task of
its own and, when the call is cancelled from outside (gRPC cancels a unary handler; the pump is
cancelled), cancels the replica's request but never reads that task's result. A client that goes
away is a normal event (the replica logs the call as CANCELLED at INFO), so ``quiet_cancels``
gives the proxy's event loop an exception handler that logs exactly those at DEBUG and hands
every other one to the handler that was there.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

from deployments.protos import specray_pb2_grpc

log = logging.getLogger("specray.grpc")

_END = object()
_WRAPPED = "_specray_cancel_on_done"
_QUIET = "_specray_quiet_cancels"


def add_generation_servicer(servicer: Any, server: Any) -> None:
    """``grpc_servicer_functions`` entry: the service, with cancels that always reach the replica
    and that leave no error in the proxy's log."""
    factory = getattr(server, "service_handler_factory", None)
    if factory is not None and not getattr(factory, _WRAPPED, False):
        server.service_handler_factory = cancel_on_done(factory)
    try:
        quiet_cancels(asyncio.get_running_loop())  # Serve registers servicers on the proxy's loop
    except RuntimeError:  # no running loop (called outside the proxy): nothing to quiet
        pass
    specray_pb2_grpc.add_GenerationServicer_to_server(servicer, server)


def _is_cancel(exc: BaseException | None) -> bool:
    from ray.exceptions import TaskCancelledError
    from ray.serve.exceptions import RequestCancelledError

    return isinstance(exc, (RequestCancelledError, TaskCancelledError, asyncio.CancelledError))


def quiet_cancels(loop: asyncio.AbstractEventLoop) -> None:
    """Unretrieved cancels of a request (a client gone) are logged at DEBUG on ``loop``; anything
    else goes to the loop's previous exception handler (or its default). Idempotent."""
    previous = loop.get_exception_handler()
    if getattr(previous, _QUIET, False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if _is_cancel(exc):
            log.debug("a cancelled call's request ended: %s", exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    setattr(handler, _QUIET, True)
    loop.set_exception_handler(handler)


def cancel_on_done(factory: Callable) -> Callable:
    """A handler factory like ``factory`` whose server-streaming handlers are ``pumped``."""

    def make(service_method: str, streaming_type: Any) -> Callable:
        handler = factory(service_method=service_method, streaming_type=streaming_type)
        return pumped(handler) if getattr(streaming_type, "value", streaming_type) == "unary_stream" else handler

    setattr(make, _WRAPPED, True)
    return make


def pumped(handler: Callable[[Any, Any], AsyncIterator]) -> Callable[[Any, Any], AsyncIterator]:
    """``handler(request, context)``'s stream, read by a task that the call's end cancels."""

    async def unary_stream(request: Any, context: Any) -> AsyncIterator:
        items: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                async for item in handler(request, call):
                    items.put_nowait(item)
            except BaseException as e:  # handed to the reader (a cancel of a gone call has none)
                items.put_nowait(e)
                raise
            finally:
                items.put_nowait(_END)

        call = CallContext(context)
        task = asyncio.create_task(pump())

        def ended(*_) -> None:
            call.ended = True
            task.cancel()

        context.add_done_callback(ended)
        try:
            while (item := await items.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            task.cancel()

    return unary_stream


class CallContext:
    """A call's gRPC context that is safe to use after the call has ended: while it runs, everything
    goes to the context; after, ``peer()`` and ``invocation_metadata()`` answer from what was read at
    the start and every other method does nothing and returns None."""

    def __init__(self, context: Any):
        self._context = context
        self._peer = context.peer()
        self._metadata = tuple(context.invocation_metadata() or ())
        self.ended = False

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple:
        return self._metadata

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._context, name)
        if self.ended and callable(attr):
            return _nothing
        return attr


def _nothing(*_args, **_kwargs) -> None:
    return None
