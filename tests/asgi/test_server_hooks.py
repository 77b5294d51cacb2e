"""The `SEND_NOWAIT` extension's two hooks between server, guard and app, at the ASGI level.

`on_disconnect`: a server that says itself when the client leaves (the sidecar's HTTP/1.1
server) spares the guard its watcher task. `stop`: the app's own close of its upstream,
which the guard calls the moment it stops a stream, before the app's task hears of it.
The server side is written by hand here: the test calls the slot as the server would.
"""

from __future__ import annotations

import asyncio
from typing import Any

from middleware.errors import Outcome, UpstreamProtocolError
from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.types import SEND_NOWAIT, Message, Receive, Scope, Send
from tests.support.apps import SCOPE, SSE_HEADERS, chunk
from tests.support.faulty import record_outcomes

START = {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}


class Served:
    """One request through `app`, with a hand-written server: its extension dict, what was
    sent, a client that never leaves unless told, and the app's stop calls."""

    def __init__(self, app: Any, *, slot: bool = True) -> None:
        self.offer: dict[str, Any] = {"send": lambda body: False}
        if slot:
            self.offer["on_disconnect"] = None
        self.scope: Scope = {**SCOPE, "extensions": {SEND_NOWAIT: self.offer}}
        self.sent: list[Message] = []
        self.body_read = False
        self.gone = asyncio.Event()
        self.task = asyncio.create_task(app(self.scope, self.receive, self.send))

    async def receive(self) -> Message:
        if not self.body_read:
            self.body_read = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        """The client is gone: the server says so through the slot, if it offered one and
        it was taken, and through `receive()` as every server does."""
        self.gone.set()
        listener = self.offer.get("on_disconnect")
        if listener is not None:
            listener()


def streaming_app(
    stops: list[str], streaming: asyncio.Event, upstream: asyncio.Future[None]
) -> Any:
    """Streams one chunk, registers its `stop`, then waits on `upstream` (an idle stream)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(START)
        await send({"type": "http.response.body", "body": chunk("a"), "more_body": True})
        scope["extensions"][SEND_NOWAIT]["stop"] = lambda: stops.append("stop")
        streaming.set()
        try:
            await upstream
        except asyncio.CancelledError:
            stops.append("cancelled")
            raise

    return app


async def test_a_server_that_tells_of_a_disconnect_spares_the_watcher_task() -> None:
    """With the slot offered, the guard takes it and runs no task of its own for the stream;
    the server's call ends the stream as `client_disconnected`. Without the slot, the guard
    watches `receive()` with one task, as before."""
    for slot, extra_tasks in ((True, 0), (False, 1)):
        stops: list[str] = []
        streaming, upstream = asyncio.Event(), asyncio.get_running_loop().create_future()
        with record_outcomes() as outcomes:
            baseline = len(asyncio.all_tasks())
            served = Served(StreamGuard(streaming_app(stops, streaming, upstream)), slot=slot)
            await asyncio.wait_for(streaming.wait(), 5)
            assert len(asyncio.all_tasks()) == baseline + 1 + extra_tasks, slot
            assert callable(served.offer.get("on_disconnect")) is slot
            served.leave()
            await asyncio.wait_for(served.task, 5)
        assert outcomes == [Outcome.CLIENT_DISCONNECTED]
        assert stops == ["stop", "cancelled"]


async def test_the_apps_stop_runs_in_the_turn_the_client_leaves_before_its_cancellation() -> None:
    """The server's `on_disconnect` call runs the app's `stop` before it returns: the app's
    upstream is closed in that loop turn; the app's task is cancelled only after."""
    stops: list[str] = []
    streaming, upstream = asyncio.Event(), asyncio.get_running_loop().create_future()
    served = Served(StreamGuard(streaming_app(stops, streaming, upstream)))
    await asyncio.wait_for(streaming.wait(), 5)
    served.leave()
    assert stops == ["stop"]
    await asyncio.wait_for(served.task, 5)
    assert stops == ["stop", "cancelled"]


async def test_the_apps_stop_runs_when_a_timeout_or_a_drain_stops_the_stream() -> None:
    """Every stop the guard decides calls the app's `stop` once: an idle timeout and a drain
    as much as a client gone; the stream's outcome and terminal event are as without it."""
    for cause, expected in (("idle", Outcome.IDLE_TIMEOUT), ("drain", Outcome.SHUTDOWN)):
        stops: list[str] = []
        streaming, upstream = asyncio.Event(), asyncio.get_running_loop().create_future()
        registry = StreamRegistry()
        idle = 0.05 if cause == "idle" else None
        guard = StreamGuard(
            streaming_app(stops, streaming, upstream), idle_timeout=idle, registry=registry
        )
        with record_outcomes() as outcomes:
            served = Served(guard)
            await asyncio.wait_for(streaming.wait(), 5)
            if cause == "drain":
                registry.shut_down_all()
            await asyncio.wait_for(served.task, 5)
        assert outcomes == [expected]
        assert stops == ["stop", "cancelled"]
        assert b'"error"' in served.sent[-1]["body"] and not served.sent[-1]["more_body"]


async def test_what_the_app_raises_after_its_stop_leaves_the_outcome_the_stops() -> None:
    """An app whose `stop` closed its upstream may wake with that upstream's error before the
    cancellation reaches it: the stream still ends as the guard stopped it (client gone),
    not as an upstream error."""
    upstream = asyncio.get_running_loop().create_future()
    streaming = asyncio.Event()

    def closed() -> None:  # what an upstream connection closed under its reader does
        upstream.set_exception(UpstreamProtocolError("the upstream connection is closed"))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(START)
        await send({"type": "http.response.body", "body": chunk("a"), "more_body": True})
        scope["extensions"][SEND_NOWAIT]["stop"] = closed
        streaming.set()
        await upstream

    with record_outcomes() as outcomes:
        served = Served(StreamGuard(app))
        await asyncio.wait_for(streaming.wait(), 5)
        served.leave()
        await asyncio.wait_for(served.task, 5)
    assert outcomes == [Outcome.CLIENT_DISCONNECTED]


async def test_a_guard_inside_a_guard_finds_the_slot_taken_and_watches_receive() -> None:
    """The slot takes one listener: the outer guard's. The inner guard watches `receive()`
    (the outer's, which says `http.disconnect` once the outer heard the client leave): both
    stop the stream (each calls the app's `stop`), the app is cancelled once, and the outer
    guard, the one the server serves, ends it as `client_disconnected`."""
    stops: list[str] = []
    streaming, upstream = asyncio.Event(), asyncio.get_running_loop().create_future()
    with record_outcomes() as outcomes:
        served = Served(StreamGuard(StreamGuard(streaming_app(stops, streaming, upstream))))
        await asyncio.wait_for(streaming.wait(), 5)
        served.leave()
        await asyncio.wait_for(served.task, 5)
    assert len(outcomes) == 2 and outcomes[-1] is Outcome.CLIENT_DISCONNECTED
    assert stops == ["stop", "stop", "cancelled"]
