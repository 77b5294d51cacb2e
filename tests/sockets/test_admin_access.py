"""The admin listener over real loopback sockets: a loopback peer (127.0.0.1, ::1, and
::ffff:127.0.0.1 on a dual-stack listener) may use every endpoint without a token, and the
live view's event stream holds at most MAX_WATCHERS clients, giving each place back however
its client leaves. From another address: tests/system/test_admin_other_pod.py."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.streams_view import MAX_WATCHERS, WATCHERS_RETRY_AFTER
from tests.support.clients import RawResponse, request
from tests.support.servers import serve


@dataclass
class Admin:
    app: AdminApp
    drains: list[bool]


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def admin_app(upstream: int) -> Admin:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
    drains: list[bool] = []
    health = UpstreamHealth(settings.upstream, "/health")
    return Admin(AdminApp(StreamRegistry(), health, lambda: drains.append(True)), drains)


async def status(port: int, method: str, path: str, host: str = "127.0.0.1") -> int:
    response = await request(port, method, path, host=host)
    try:
        if path != "/streams/events":
            await response.body()
        return response.status
    finally:
        response.close()


async def until(condition: Callable[[], bool]) -> None:
    """Wait, up to 5 s, for a state the server reaches on its own (after a disconnect)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_loopback_peer_uses_every_endpoint_without_a_token(upstream: int, host: str) -> None:
    """From 127.0.0.1 or ::1, with no token configured: probes, metrics, the live view and
    POST /drain all answer, and the drain starts."""
    admin = admin_app(upstream)
    async with serve(admin.app, host=host, proxy_headers=False) as port:
        for path in ("/livez", "/readyz", "/metrics", "/streams", "/streams/events", "/"):
            assert await status(port, "GET", path, host) == 200, path
        assert await status(port, "POST", "/drain", host) == 202
    assert admin.drains == [True]


async def test_ipv4_mapped_loopback_on_a_dual_stack_listener(upstream: int) -> None:
    """A listener on `::` sees an IPv4 client as ::ffff:127.0.0.1: still loopback."""
    admin = admin_app(upstream)
    seen: list[tuple[str, int]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            seen.append(scope["client"])
        await admin.app(scope, receive, send)

    with socket.socket(socket.AF_INET6) as probe:  # the listener below must be dual-stack
        assert probe.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
    async with serve(app, host="::", proxy_headers=False) as port:
        assert await status(port, "POST", "/drain", "127.0.0.1") == 202
    assert admin.drains == [True]
    assert seen[0][0] == "::ffff:127.0.0.1"


async def test_event_stream_watchers_are_bounded(upstream: int) -> None:
    """At most MAX_WATCHERS clients follow /streams/events at once; the next one gets 503 with
    Retry-After and a JSON error. A client that leaves, after its head or before it, gives
    its place back."""
    admin = admin_app(upstream)
    view = admin.app.view
    async with serve(admin.app, proxy_headers=False) as port:
        feeds: list[RawResponse] = []
        try:
            for _ in range(MAX_WATCHERS):
                feeds.append(await request(port, "GET", "/streams/events"))
                assert feeds[-1].status == 200
            assert view.watchers == MAX_WATCHERS
            refused = await request(port, "GET", "/streams/events")
            body = json.loads(await refused.body())
            refused.close()
            assert refused.status == 503
            assert refused.header("retry-after") == str(WATCHERS_RETRY_AFTER)
            assert body["error"]["code"] == "too_many_watchers"
            assert await status(port, "GET", "/streams") == 200  # the JSON view is not bounded so

            feeds.pop().close()
            await until(lambda: view.watchers == MAX_WATCHERS - 1)
            feeds.append(await request(port, "GET", "/streams/events"))
            assert feeds[-1].status == 200 and view.watchers == MAX_WATCHERS
        finally:
            for feed in feeds:
                feed.close()
        await until(lambda: view.watchers == 0)

        # Gone before the response head: the place comes back all the same.
        for _ in range(MAX_WATCHERS * 2):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /streams/events HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            writer.close()
        await until(lambda: view.watchers == 0)
        feed = await request(port, "GET", "/streams/events")
        feed.close()
        assert feed.status == 200
