"""The reverse proxy on real sockets (uvicorn in front, test upstreams behind), plus a few
ASGI-level tests driving `ProxyApp` with hand-written receive/send."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from middleware.errors import UpstreamConnectError, UpstreamProtocolError
from middleware.types import SEND_NOWAIT, Message
from sidecar.proxy import ProxyApp
from sidecar.upstream.h1pool import H1Pool
from sidecar.upstream.types import Upstream
from tests.support import clients
from tests.support.servers import Server, serve
from tests.support.upstreams import (
    EchoUpstream,
    ErrorResponder,
    RawConnection,
    RawUpstream,
    closed_port,
    header,
    serve_unix,
)


@contextlib.asynccontextmanager
async def proxied(
    upstream: str, server: Server = "uvicorn-httptools", **options: Any
) -> AsyncIterator[tuple[int, ProxyApp, ErrorResponder]]:
    """The proxy (behind the ErrorResponder shim) served on 127.0.0.1, in front of `upstream`."""
    app = ProxyApp(Upstream.parse(upstream), **options)
    shim = ErrorResponder(app)
    # proxy_headers=False: uvicorn would otherwise take the client address from
    # X-Forwarded-For (trusted from 127.0.0.1) and the proxy would append it twice.
    server_options = {} if server == "hypercorn" else {"proxy_headers": False}
    try:
        async with serve(shim, server=server, **server_options) as port:
            yield port, app, shim
    finally:
        await app.aclose()


@contextlib.asynccontextmanager
async def echo_chain(
    server: Server = "uvicorn-httptools", **options: Any
) -> AsyncIterator[tuple[int, EchoUpstream, ProxyApp]]:
    echo = EchoUpstream()
    async with (
        serve(echo) as upstream_port,
        proxied(f"http://127.0.0.1:{upstream_port}", server, **options) as (port, app, _),
    ):
        yield port, echo, app


async def echoed(response: clients.RawResponse) -> dict[str, Any]:
    assert response.status == 200, await response.body()
    record: dict[str, Any] = json.loads(await response.body())
    response.close()
    return record


# --- faithful proxying ---------------------------------------------------------------


async def test_method_path_query_headers_body_reach_upstream() -> None:
    """Method, raw path (percent-encoding kept), query, end-to-end headers and body arrive."""
    async with echo_chain() as (port, _, _):
        response = await clients.request(
            port,
            "PATCH",
            "/v1/a%2Fb/c%20d?x=1&y=%2F&x=2",
            body=b"hello \x00 body",
            headers=[("X-Custom", "one"), ("Authorization", "Bearer t")],
        )
        record = await echoed(response)
    assert record["method"] == "PATCH"
    assert record["raw_path"] == "/v1/a%2Fb/c%20d"
    assert record["query_string"] == "x=1&y=%2F&x=2"
    assert header(record, "x-custom") == ["one"]
    assert header(record, "authorization") == ["Bearer t"]
    assert header(record, "content-length") == ["12"]
    assert record["body"] == "hello \x00 body"


async def test_ten_megabyte_body_arrives_byte_identical() -> None:
    """A 10 MB body arrives byte-identical, with the client's Content-Length."""
    body = os.urandom(10 * 1024 * 1024)
    async with echo_chain() as (port, _, _):
        record = await echoed(await clients.request(port, "POST", "/upload", body=body))
    assert record["body_length"] == len(body)
    assert record["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert header(record, "content-length") == [str(len(body))]
    assert header(record, "transfer-encoding") == []


async def test_chunked_request_body_is_sent_chunked() -> None:
    """A chunked client body goes upstream chunked (no Content-Length invented), intact."""
    parts = [b"first ", b"second ", b"third"]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    async with echo_chain() as (port, _, _):
        response = await clients.request(
            port, "POST", "/c", body=wire, headers=[("Transfer-Encoding", "chunked")]
        )
        record = await echoed(response)
    assert header(record, "transfer-encoding") == ["chunked"]
    assert header(record, "content-length") == []
    assert record["body"] == "first second third"


async def test_request_body_is_streamed_not_buffered() -> None:
    """The upstream sees the first body bytes before the client has sent the rest."""
    async with echo_chain() as (port, echo, _), clients.connection(port) as (reader, writer):
        head = f"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: {2 * 65536}\r\n\r\n"
        writer.write(head.encode() + b"a" * 65536)
        await writer.drain()
        # A buffering proxy would wait for the whole body: this wait would time out.
        await asyncio.wait_for(echo.first_body.wait(), 5)
        writer.write(b"b" * 65536)
        record = await echoed(await clients.read_response(reader, writer))
    assert record["body_sha256"] == hashlib.sha256(b"a" * 65536 + b"b" * 65536).hexdigest()


async def test_non_streaming_response_is_byte_identical_with_content_length() -> None:
    """A fixed-length response keeps its Content-Length and arrives byte-identical."""
    async with echo_chain() as (port, _, _):
        response = await clients.request(port, "GET", "/bytes?size=300000")
        body = await response.body()
        response.close()
    assert response.status == 200
    assert response.header("content-length") == "300000"
    assert body == bytes(i % 251 for i in range(300000))


async def test_each_upstream_chunk_is_relayed_as_it_arrives() -> None:
    """Each upstream chunk reaches the client before the upstream produces the next one."""
    async with echo_chain() as (port, echo, _):
        response = await clients.request(port, "GET", "/gated")
        assert response.status == 200
        assert response.header("content-type") == "text/event-stream"
        for i in range(3):
            event = f"data: {i}\n\n".encode()
            await echo.gate.put(event)
            assert await asyncio.wait_for(response.chunk(), 5) == event
        await echo.gate.put(None)
        assert await response.chunk() is None
        response.close()


async def test_head_response_has_length_but_no_body() -> None:
    """HEAD gets the upstream's Content-Length and no body bytes: the next response on the
    same client connection starts clean."""
    async with echo_chain() as (port, _, _), clients.connection(port) as (reader, writer):
        writer.write(b"HEAD /bytes?size=10 HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await clients.read_response(reader, writer)
        assert (head.status, head.header("content-length")) == (200, "10")
        writer.write(b"GET /bytes?size=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        response = await clients.read_response(reader, writer)
        assert (response.status, await response.body()) == (200, bytes([0, 1, 2]))


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_upstream_error_statuses_pass_through(status: int) -> None:
    """The upstream's own 4xx/5xx reach the client unchanged: status, headers and body."""
    async with echo_chain() as (port, _, _):
        response = await clients.request(port, "GET", f"/status/{status}")
        body = await response.body()
        response.close()
    assert response.status == status
    assert response.header("x-upstream") == "yes"
    assert json.loads(body) == {"status": status}


# --- header hygiene --------------------------------------------------------------------


async def test_request_hop_by_hop_headers_dropped_and_forwarded_headers_added() -> None:
    """Hop-by-hop headers and those named in Connection never reach the upstream; Host is
    the upstream's; X-Forwarded-* are added; the upstream is asked for identity."""
    async with echo_chain() as (port, _, _):
        upstream_host = f"127.0.0.1:{port}"  # replaced below by the proxy's upstream port
        response = await clients.request(
            port,
            "GET",
            "/h",
            headers=[
                ("Connection", "keep-alive, X-Secret"),
                ("X-Secret", "drop me"),
                ("Keep-Alive", "timeout=5"),
                ("Proxy-Authorization", "Basic eA=="),
                ("Proxy-Connection", "keep-alive"),
                ("TE", "trailers"),
                ("Trailer", "X-T"),
                ("Accept-Encoding", "gzip, br"),
                ("X-Forwarded-For", "10.0.0.1"),
                ("X-Forwarded-Proto", "https"),
                ("X-Kept", "kept"),
            ],
        )
        record = await echoed(response)
    names = {k for k, _ in record["headers"]}
    for dropped in ("x-secret", "keep-alive", "proxy-authorization", "proxy-connection", "te"):
        assert dropped not in names
    assert "trailer" not in names
    assert header(record, "x-kept") == ["kept"]
    assert header(record, "host") != [upstream_host]
    assert header(record, "host")[0].startswith("127.0.0.1:")
    assert header(record, "accept-encoding") == ["identity"]
    assert header(record, "x-forwarded-for") == ["10.0.0.1, 127.0.0.1"]
    assert header(record, "x-forwarded-proto") == ["http"]
    assert header(record, "x-forwarded-host") == [upstream_host]


async def test_response_hop_by_hop_headers_dropped() -> None:
    """Hop-by-hop response headers and those named in the upstream's Connection are dropped."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(
            b"HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
            b"Proxy-Authenticate: Basic\r\nProxy-Connection: keep-alive\r\nTrailer: X-T\r\n"
            b"Upgrade: foo\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok"
        )
        await conn.wait_eof()

    async with (
        RawUpstream(handler).running() as raw,
        proxied(f"http://127.0.0.1:{raw.port}") as (port, _, _),
    ):
        response = await clients.request(port, "GET", "/")
        assert await response.body() == b"ok"
        response.close()
    names = {k.lower() for k, _ in response.headers}
    for dropped in ("x-hop", "keep-alive", "proxy-authenticate", "proxy-connection", "trailer"):
        assert dropped not in names
    assert "upgrade" not in names
    assert response.header("x-kept") == "1"


# --- limits ----------------------------------------------------------------------------


async def test_declared_body_over_max_body_is_413_without_contacting_upstream() -> None:
    """A Content-Length above max_body is answered 413 JSON; the upstream sees nothing."""
    async with echo_chain(max_body=1000) as (port, echo, _):
        response = await clients.request(port, "POST", "/big", body=b"x" * 1001)
        body = json.loads(await response.body())
        response.close()
    assert response.status == 413
    assert body["error"]["code"] == "request_too_large"
    assert echo.seen == []


async def test_streamed_body_passing_max_body_is_413() -> None:
    """A chunked body that grows past max_body stops and is answered 413."""
    wire = b"".join(b"200\r\n" + b"y" * 512 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n"
    async with echo_chain(max_body=1500) as (port, echo, _):
        response = await clients.request(
            port, "POST", "/big", body=wire, headers=[("Transfer-Encoding", "chunked")]
        )
        body = json.loads(await response.body())
        response.close()
    assert response.status == 413
    assert body["error"]["code"] == "request_too_large"
    # Streaming means the upstream got the start; it never gets more than the limit.
    assert all(record["body_length"] <= 1500 for record in echo.seen)


async def test_oversized_request_headers_are_431() -> None:
    """Request headers above max_header_bytes are answered 431 JSON without the upstream."""
    async with echo_chain(max_header_bytes=2048) as (port, echo, _):
        response = await clients.request(port, "GET", "/", headers=[("X-Big", "z" * 2100)])
        body = json.loads(await response.body())
        response.close()
    assert response.status == 431
    assert body["error"]["code"] == "request_header_fields_too_large"
    assert echo.seen == []


async def test_trace_is_405_on_the_wire() -> None:
    """TRACE is refused with 405 JSON and an Allow header; the upstream sees nothing."""
    async with echo_chain() as (port, echo, _):
        response = await clients.request(port, "TRACE", "/")
        body = json.loads(await response.body())
        response.close()
    assert response.status == 405
    assert response.header("allow") is not None
    assert body["error"]["code"] == "method_not_allowed"
    assert echo.seen == []


async def test_connect_is_405() -> None:
    """CONNECT is refused with 405 (ASGI level: servers treat CONNECT specially)."""
    app = ProxyApp(Upstream.parse(f"http://127.0.0.1:{closed_port()}"))
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "CONNECT", "path": "/", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    assert sent[0]["status"] == 405


# --- not an open proxy -----------------------------------------------------------------


@pytest.mark.parametrize("server", ["uvicorn-httptools", "uvicorn-h11"])
async def test_absolute_form_and_foreign_host_never_change_the_origin(server: Server) -> None:
    """An absolute-form target and a Host naming another server still go to the configured
    upstream only, with the path and query of the target."""
    other = EchoUpstream()
    async with (
        serve(other) as other_port,
        echo_chain(server) as (port, echo, _),
        clients.connection(port) as (reader, writer),
    ):
        writer.write(
            f"GET http://127.0.0.1:{other_port}/x/y?q=1 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{other_port}\r\n\r\n".encode()
        )
        record = await echoed(await clients.read_response(reader, writer))
    assert other.seen == []
    assert len(echo.seen) == 1
    assert record["raw_path"] == "/x/y"
    assert record["query_string"] == "q=1"
    assert header(record, "x-forwarded-host") == [f"127.0.0.1:{other_port}"]


# --- upstream errors -------------------------------------------------------------------


async def test_connection_refused_raises_upstream_connect_error() -> None:
    """Connection refused raises UpstreamConnectError, which the shim answers 502 JSON."""
    async with proxied(f"http://127.0.0.1:{closed_port()}") as (port, _, shim):
        response = await clients.request(port, "GET", "/")
        body = json.loads(await response.body())
        response.close()
    assert [type(e) for e in shim.errors] == [UpstreamConnectError]
    assert response.status == 502
    assert body["error"]["code"] == "upstream_unreachable"


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 100\r\n\r\n0123456789",
        b"Transfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n",
    ],
)
async def test_upstream_dying_mid_body_raises_protocol_error(framing: bytes) -> None:
    """The upstream closing inside its body raises UpstreamProtocolError after the headers."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"HTTP/1.1 200 OK\r\n" + framing)
        await conn.writer.drain()

    async with (
        RawUpstream(handler).running() as raw,
        proxied(f"http://127.0.0.1:{raw.port}") as (port, _, shim),
    ):
        response = await clients.request(port, "GET", "/")
        assert response.status == 200
        with contextlib.suppress(ConnectionError):
            await response.body()
        response.close()
    assert [type(e) for e in shim.errors] == [UpstreamProtocolError]


async def test_upstream_sending_garbage_raises_protocol_error() -> None:
    """An invalid HTTP response raises UpstreamProtocolError, answered 502 by the shim."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"SMTP ready\r\n\r\n")
        await conn.writer.drain()

    async with (
        RawUpstream(handler).running() as raw,
        proxied(f"http://127.0.0.1:{raw.port}") as (port, _, shim),
    ):
        response = await clients.request(port, "GET", "/")
        await response.body()
        response.close()
    assert [type(e) for e in shim.errors] == [UpstreamProtocolError]
    assert response.status == 502


# --- connections -----------------------------------------------------------------------


async def test_upstream_connection_is_reused_for_sequential_requests() -> None:
    """Sequential requests share one upstream connection (same client port upstream)."""
    async with echo_chain() as (port, echo, app):
        for _ in range(5):
            await echoed(await clients.request(port, "GET", "/r"))
        assert isinstance(app.pool, H1Pool)
        assert app.pool.idle_count == 1
    assert len({tuple(r["client"]) for r in echo.seen}) == 1
    assert len(echo.seen) == 5


async def test_stale_keepalive_connection_is_retried_on_a_fresh_one() -> None:
    """A reused connection the upstream closes without answering is retried once, fresh."""
    served: list[int] = []

    async def handler(conn: RawConnection) -> None:
        first = len(served) == 0
        while await conn.read_head():
            if first and served:
                conn.writer.close()  # the keep-alive race: closes instead of answering
                return
            served.append(1)
            conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await conn.writer.drain()

    async with (
        RawUpstream(handler).running() as raw,
        proxied(f"http://127.0.0.1:{raw.port}") as (port, _, shim),
    ):
        for _ in range(2):
            response = await clients.request(port, "GET", "/")
            assert (response.status, await response.body()) == (200, b"ok")
            response.close()
    assert shim.errors == []
    assert len(raw.connections) == 2


async def test_unix_socket_upstream() -> None:
    """A unix:/path upstream is reached over its socket, with Host localhost."""
    echo = EchoUpstream()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "up.sock")
        async with serve_unix(echo, path), proxied(f"unix:{path}") as (port, _, _):
            record = await echoed(await clients.request(port, "POST", "/u?a=b", body=b"unix"))
    assert (record["raw_path"], record["query_string"], record["body"]) == ("/u", "a=b", "unix")
    assert header(record, "host") == ["localhost"]


async def test_h2c_upstream_streams_and_multiplexes() -> None:
    """An h2c upstream (hypercorn, prior knowledge): bodies both ways, SSE streamed, and
    concurrent requests multiplexed on one connection."""
    echo = EchoUpstream()
    async with (
        serve(echo, server="hypercorn") as upstream_port,
        proxied(f"h2c://127.0.0.1:{upstream_port}") as (port, _, shim),
    ):
        record = await echoed(await clients.request(port, "POST", "/p?z=1", body=b"h2 body"))
        assert (record["http_version"], record["body"], record["query_string"]) == (
            "2",
            "h2 body",
            "z=1",
        )
        wire = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        record = await echoed(
            await clients.request(
                port, "POST", "/c", body=wire, headers=[("Transfer-Encoding", "chunked")]
            )
        )
        assert record["body"] == "abcde"
        response = await clients.request(port, "GET", "/gated")
        await echo.gate.put(b"data: 1\n\n")
        assert await asyncio.wait_for(response.chunk(), 5) == b"data: 1\n\n"
        await echo.gate.put(None)
        assert await response.chunk() is None
        response.close()
        records = await asyncio.gather(
            *[echoed(await clients.request(port, "GET", f"/m{i}")) for i in range(4)]
        )
    assert shim.errors == []
    clients_seen = {tuple(r["client"]) for r in [*records, *echo.seen] if "client" in r}
    assert len(clients_seen) == 1


async def test_http2_client_body_without_length_is_sent_chunked() -> None:
    """An HTTP/2 client's body without Content-Length goes upstream chunked; a body-less
    HTTP/2 request stays body-less (no framing header invented)."""

    async def parts() -> AsyncIterator[bytes]:
        yield b"from "
        yield b"h2"

    echo = EchoUpstream()
    async with (
        serve(echo) as upstream_port,
        proxied(f"http://127.0.0.1:{upstream_port}", "hypercorn") as (port, _, _),
        httpx.AsyncClient(http1=False, http2=True) as client,
    ):
        posted = await client.post(f"http://127.0.0.1:{port}/p", content=parts())
        got = await client.get(f"http://127.0.0.1:{port}/g")
    assert posted.http_version == "HTTP/2"
    record = posted.json()
    assert record["body"] == "from h2"
    assert header(record, "transfer-encoding") == ["chunked"]
    record = got.json()
    assert header(record, "transfer-encoding") == []
    assert header(record, "content-length") == []
    assert header(record, "x-forwarded-host") == [f"127.0.0.1:{port}"]


# --- cancellation ----------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before-headers", "mid-body"])
async def test_cancelling_the_request_closes_the_upstream_connection_at_once(when: str) -> None:
    """Cancelling the task running the proxy (what StreamGuard does on disconnect) closes
    the upstream HTTP/1.1 connection: the upstream sees EOF within 50 ms, and the half-read
    connection is not pooled."""
    got_request = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        if when == "mid-body":
            conn.writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
            )
        got_request.set()
        await conn.wait_eof()  # then silent

    sent: list[Message] = []
    first_body = asyncio.Event()

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            first_body.set()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with RawUpstream(handler).running() as raw:
        app = ProxyApp(Upstream.parse(f"http://127.0.0.1:{raw.port}"))
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/",
            "raw_path": b"/",
            "query_string": b"",
            "headers": [(b"host", b"client")],
            "client": ("127.0.0.1", 5555),
            "scheme": "http",
        }
        task = asyncio.create_task(app(scope, receive, send))
        await asyncio.wait_for(got_request.wait(), 5)
        if when == "mid-body":
            await asyncio.wait_for(first_body.wait(), 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(raw.connections[0].eof.wait(), 1)
        eof_at = raw.connections[0].eof_at
        assert isinstance(app.pool, H1Pool)
        assert app.pool.idle_count == 0
        await app.aclose()
    assert eof_at is not None
    assert eof_at - cancelled_at < 0.05


async def test_the_proxys_stop_closes_the_upstream_connection_without_its_task() -> None:
    """Given the `SEND_NOWAIT` extension, the proxy puts its HTTP/1.1 connection's close there
    as `stop` once the response has begun: calling it closes the upstream connection while
    the proxy's task is stuck elsewhere (here in a `send` that never returns), and the
    connection is not pooled."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
        )
        await conn.wait_eof()  # then silent

    stuck = asyncio.Event()
    offer: dict[str, Any] = {"send": lambda body: False}
    scope = {**asgi_get("/"), "extensions": {SEND_NOWAIT: offer}}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            stuck.set()
            await asyncio.Event().wait()  # a client that takes nothing

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with RawUpstream(handler).running() as raw:
        app = ProxyApp(Upstream.parse(f"http://127.0.0.1:{raw.port}"))
        task = asyncio.create_task(app(scope, receive, send))
        await asyncio.wait_for(stuck.wait(), 5)
        offer["stop"]()
        await asyncio.wait_for(raw.connections[0].eof.wait(), 1)
        assert not task.done()  # still in its send: the close did not wait for it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert isinstance(app.pool, H1Pool)
        assert app.pool.idle_count == 0
        await app.aclose()


def asgi_get(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"client")],
        "client": ("127.0.0.1", 5555),
        "scheme": "http",
    }


async def test_cancelling_an_h2c_stream_resets_it_and_keeps_the_connection() -> None:
    """Cancelling the proxy task mid-stream on an h2c upstream ends that stream (the upstream
    app sees http.disconnect) while the shared connection keeps serving other requests."""
    echo = EchoUpstream()
    first_body = asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            first_body.set()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with serve(echo, server="hypercorn") as upstream_port:
        app = ProxyApp(Upstream.parse(f"h2c://127.0.0.1:{upstream_port}"))
        task = asyncio.create_task(app(asgi_get("/hold"), receive, send))
        await asyncio.wait_for(first_body.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(echo.disconnected.wait(), 2)
        await app(asgi_get("/after"), receive, send)
        await app.aclose()
    assert len({tuple(r["client"]) for r in echo.seen}) == 1
    assert [r.get("path", r.get("raw_path")) for r in echo.seen] == ["/hold", "/after"]


# --- ASGI scopes and URL parsing -------------------------------------------------------


async def test_lifespan_and_websocket_scopes() -> None:
    """Lifespan startup/shutdown complete (shutdown closes the pool); websockets are refused."""
    app = ProxyApp(Upstream.parse("http://127.0.0.1:1"))
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return inbox.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    inbox[:] = [{"type": "websocket.connect"}]
    sent.clear()
    await app({"type": "websocket", "path": "/"}, receive, send)
    assert sent[0]["type"] == "websocket.close"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000", ("http", "127.0.0.1", 8000, None, b"127.0.0.1:8000")),
        ("http://vllm/", ("http", "vllm", 80, None, b"vllm:80")),
        ("h2c://[::1]:9000", ("h2c", "::1", 9000, None, b"[::1]:9000")),
        ("unix:/run/vllm.sock", ("unix", "localhost", 80, "/run/vllm.sock", b"localhost")),
        ("https://api.example", ("https", "api.example", 443, None, b"api.example:443")),
    ],
)
def test_upstream_parse(url: str, expected: tuple[Any, ...]) -> None:
    """Upstream.parse accepts http://, https://, h2c:// and unix: URLs and round-trips them."""
    up = Upstream.parse(url)
    assert (up.scheme, up.host, up.port, up.path, up.authority) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://x", "scheme"),
        ("http://x:1/v1", "path"),
        ("http://x:99999", "port"),
        ("http://:80", "host"),
        ("http://u:p@x:1", "credentials"),
        ("unix:relative.sock", "absolute"),
        ("localhost:8000", "scheme"),
    ],
)
def test_upstream_parse_rejects_bad_urls(url: str, says: str) -> None:
    """A bad upstream URL raises ValueError with a message naming the problem."""
    with pytest.raises(ValueError, match=says):
        Upstream.parse(url)
