"""A deadline reaches the reader on time even when the app cannot be stopped.

The app here is what llama-cpp-python's server does during a prefill: it sends its headers at
once, then blocks in a worker thread (`anyio.to_thread.run_sync`, which a cancellation does not
abandon) for longer than a deadline. The rule: the reader gets keep-alives until the deadline,
then the terminal event within one keep-alive interval of it, and nothing the app sends once it
unwinds; the outcome and the access line name the deadline. On uvicorn and hypercorn.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import anyio
import pytest

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry, semconv
from middleware.types import Receive, Scope, Send
from tests.support.clients import request
from tests.support.servers import serve

BLOCK_S = 2.5  # the worker thread's prefill: well past each deadline below
KEEPALIVE_S = 0.25
SSE = [(b"content-type", b"text/event-stream")]
LATE = b'data: {"choices":[{"delta":{"content":"too late"}}]}\n\n'


async def prefill(released: threading.Event) -> None:
    """A worker thread that cannot be abandoned: a cancellation is held until it returns
    (what a server that must not free a model's context mid-call does), then raised."""
    work = asyncio.get_running_loop().run_in_executor(None, released.wait, BLOCK_S)
    cancelled = False
    while True:
        try:
            await asyncio.shield(work)
            break
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def blocked_app(tokens_first: int, released: threading.Event) -> Any:
    """Headers at once, `tokens_first` token events, then a prefill in a worker thread that
    nothing can cancel; afterwards it tries to send one more token and the end."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for i in range(tokens_first):
            token = b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i
            await send({"type": "http.response.body", "body": token, "more_body": True})
        await prefill(released)
        await send({"type": "http.response.body", "body": LATE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@pytest.mark.parametrize("server", ["uvicorn-httptools", "hypercorn"])
@pytest.mark.parametrize(
    "deadline, tokens_first, code",
    [("first_token_timeout", 0, "first_token_timeout"), ("idle_timeout", 1, "idle_timeout")],
)
async def test_the_terminal_event_comes_at_the_deadline_not_when_the_app_unwinds(
    server: str, deadline: str, tokens_first: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """First-token and idle deadlines of 1 s against an app blocked for 2.5 s: keep-alives
    every 0.25 s until the deadline, the terminal event by 1 s + one interval, then the end:
    the app's late token never reaches the reader. The access line says the deadline."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    released = threading.Event()
    telemetry = Telemetry(metric_readers=[])
    guard = StreamGuard(
        blocked_app(tokens_first, released),
        keepalive_interval=KEEPALIVE_S,
        telemetry=telemetry,
        **{deadline: 1.0},
    )
    try:
        async with serve(guard, server) as port:
            began = time.monotonic()
            response = await request(port, "POST", "/v1/chat/completions", body=b"{}")
            body = await response.body()
            ended = time.monotonic() - began
            response.close()
    finally:
        released.set()
    text = body.decode()
    assert response.status == 200
    assert f'"code":"{code}"' in text.replace(" ", ""), text
    assert "too late" not in text
    assert ended < 1.0 + KEEPALIVE_S + 0.5, ended  # not the 2.5 s the app took
    arrivals = [(at - began, data) for at, data in response.arrivals]
    error_at = next(at for at, data in arrivals if code.encode() in data)
    assert any(b": keep-alive" in data and at < error_at for at, data in arrivals)
    with anyio.fail_after(5):  # the line follows once the app has unwound: a log record,
        # with nothing to await, so looked for every 50 ms
        while not [r for r in caplog.records if r.name == semconv.ACCESS_LOGGER]:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    (line,) = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == semconv.ACCESS_LOGGER
    ]
    assert line["outcome"] == code
