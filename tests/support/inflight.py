"""Many streams in flight through one StreamGuard, driven by hand (no server): for the live
view's bound test and `bench/lab/live_view.py`."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry
from middleware.types import Message, Receive, Scope, Send
from tests.support.apps import ROLE, SCOPE, SSE_HEADERS

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'


async def open_streams(
    count: int, release: asyncio.Event
) -> tuple[StreamRegistry, list[asyncio.Task[None]]]:
    """`count` streams in flight, each past its first token and waiting on `release`; the
    first half started earlier, so they have gone longer without a chunk."""
    started = asyncio.Event()
    waiting = 0

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal waiting
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": ROLE + TOKEN, "more_body": True})
        waiting += 1
        if waiting == count:
            started.set()
        await release.wait()
        await send({"type": "http.response.body", "body": b""})

    registry = StreamRegistry()
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    guard = StreamGuard(app, registry=registry, telemetry=telemetry)

    async def one(i: int) -> None:
        inbox: list[Message] = [{"type": "http.request", "body": b'{"model":"m"}'}]
        gone = asyncio.Event()

        async def receive() -> Message:
            if inbox:
                return inbox.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            pass

        scope = {
            **SCOPE,
            "client": ("127.0.0.1", 10000 + i),
            "headers": [(b"x-request-id", b"r%d" % i)],
        }
        await guard(scope, receive, send)

    tasks = [asyncio.create_task(one(i)) for i in range(count // 2)]
    await asyncio.sleep(0.05)
    tasks += [asyncio.create_task(one(i)) for i in range(count // 2, count)]
    await asyncio.wait_for(started.wait(), 60)
    return registry, tasks
