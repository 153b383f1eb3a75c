"""The proxy-side fix for cancelled gRPC streams (deployments/grpc_cancel.py), without Ray: the
call's end cancels the task that waits on the replica, wherever gRPC was when the client cancelled;
items and errors pass through unchanged; the proxy's code never touches an ended call's context."""
from __future__ import annotations

import asyncio

import pytest

from deployments.grpc_cancel import CallContext, add_generation_servicer, cancel_on_done, pumped


class FakeContext:
    """gRPC's servicer context as far as the proxy uses it; ``end()`` runs the done callbacks the way
    gRPC does when a call ends (a client cancel included)."""

    def __init__(self):
        self.callbacks, self.codes = [], []

    def add_done_callback(self, cb):
        self.callbacks.append(cb)

    def peer(self):
        return "ipv4:127.0.0.1:5555"

    def invocation_metadata(self):
        return (("application", "app"),)

    def set_code(self, code):
        self.codes.append(code)

    def end(self):
        for cb in self.callbacks:
            cb(self)


class Replica:
    """The proxy's stream for one call: yields ``n`` items, then waits for an item that never comes
    (a long generation) and records whether that wait was cancelled."""

    def __init__(self, n: int, fail: Exception | None = None):
        self.n, self.fail, self.cancelled = n, fail, False

    async def __call__(self, request, context):
        for i in range(self.n):
            yield f"{request}-{i}"
        if self.fail is not None:
            raise self.fail
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            context.set_code("CANCELLED")  # the proxy's status code after its cancel (ignored once ended)
            raise


def test_items_pass_through_and_errors_reach_the_caller():
    async def run():
        ctx = FakeContext()
        finite = Replica(3, fail=ValueError("replica failed"))
        got = []
        with pytest.raises(ValueError, match="replica failed"):
            async for item in pumped(finite)("req", ctx):
                got.append(item)
        return got

    got = asyncio.run(run())
    assert got == ["req-0", "req-1", "req-2"]


def test_the_calls_end_cancels_the_wait_on_the_replica_while_grpc_is_elsewhere():
    """The case Serve's proxy misses: the cancel arrives while gRPC writes an item, i.e. while the
    handler's generator is suspended at its yield and not reading the replica."""

    async def run():
        ctx, replica = FakeContext(), Replica(1)
        stream = pumped(replica)("req", ctx)
        assert await stream.__anext__() == "req-0"  # gRPC now "writes" it; nobody awaits the stream
        await asyncio.sleep(0.01)  # the pump is waiting on the replica's next item
        assert not replica.cancelled
        ctx.end()  # the client cancelled: gRPC ends the call and runs its done callbacks
        for _ in range(10):
            await asyncio.sleep(0)
        return replica.cancelled, ctx.codes  # read here: asyncio.run cancels what is left when it returns

    cancelled, codes = asyncio.run(run())
    assert cancelled, "ending the call must cancel the wait on the replica"
    assert codes == [], "the proxy's code must not touch the context of an ended call"


def test_call_context_answers_from_the_start_once_the_call_ended():
    ctx = FakeContext()
    call = CallContext(ctx)
    call.set_code("OK")
    assert ctx.codes == ["OK"] and call.peer() == ctx.peer()
    call.ended = True
    call.set_code("CANCELLED")
    assert ctx.codes == ["OK"]
    assert call.peer() == "ipv4:127.0.0.1:5555" and call.invocation_metadata() == (("application", "app"),)


def test_only_server_streaming_handlers_are_wrapped_and_the_servicer_is_registered():
    made = []

    def factory(service_method, streaming_type):
        made.append((service_method, streaming_type))
        return ("handler", service_method, streaming_type)

    wrapped = cancel_on_done(factory)
    assert wrapped(service_method="/m", streaming_type="unary_unary") == ("handler", "/m", "unary_unary")
    assert callable(wrapped(service_method="/m", streaming_type="unary_stream"))
    assert made == [("/m", "unary_unary"), ("/m", "unary_stream")]

    class Server:
        service_handler_factory = staticmethod(factory)

        def __init__(self):
            self.handlers = []

        def add_generic_rpc_handlers(self, handlers):
            self.handlers.extend(handlers)

        def add_registered_method_handlers(self, name, handlers):
            self.registered = (name, handlers)

    class Servicer:
        Generate = GenerateStream = None

    server = Server()
    add_generation_servicer(Servicer(), server)
    first = server.service_handler_factory
    add_generation_servicer(Servicer(), server)  # a second registration does not wrap twice
    assert server.service_handler_factory is first and first is not factory
    assert server.service_handler_factory(service_method="/m", streaming_type="unary_unary")[0] == "handler"
    assert server.handlers and server.registered[0] == "specray.v1.Generation"


def test_a_cancelled_request_left_unread_is_no_error_in_the_log(caplog):
    """Serve's proxy leaves a task behind whose RequestCancelledError nobody reads; asyncio would log
    it as an ERROR traceback. After ``quiet_cancels`` such a task logs at DEBUG; other unread
    errors still reach the handler that was there."""
    import gc
    import logging

    from ray.exceptions import TaskCancelledError
    from ray.serve.exceptions import RequestCancelledError

    from deployments.grpc_cancel import quiet_cancels

    seen = []

    async def fail(exc):
        raise exc

    async def run():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(context["exception"]))
        quiet_cancels(loop)
        quiet_cancels(loop)  # idempotent: does not wrap itself
        for exc in (RequestCancelledError("r-1"), TaskCancelledError(), ValueError("a real bug")):
            task = asyncio.create_task(fail(exc))
            await asyncio.sleep(0)
            del task  # never retrieved: asyncio reports it when the task is collected
            gc.collect()

    with caplog.at_level(logging.DEBUG, logger="specray.grpc"):
        asyncio.run(run())
    assert [type(e).__name__ for e in seen] == ["ValueError"]
    cancels = [r for r in caplog.records if r.name == "specray.grpc"]
    assert len(cancels) == 2 and all(r.levelno == logging.DEBUG for r in cancels)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_without_a_previous_handler_other_errors_keep_the_default_report(caplog):
    import gc
    import logging

    from deployments.grpc_cancel import quiet_cancels

    async def run():
        quiet_cancels(asyncio.get_running_loop())
        task = asyncio.create_task(asyncio.sleep(0, result=None))
        await task
        bad = asyncio.create_task(_raise(KeyError("k")))
        await asyncio.sleep(0)
        del bad
        gc.collect()

    with caplog.at_level(logging.DEBUG, logger="specray.grpc"):
        asyncio.run(run())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and "never retrieved" in errors[0].getMessage()


async def _raise(exc):
    raise exc
