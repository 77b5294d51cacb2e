"""Hostile input against the sidecar: each gets a clear status, never a hang or a forwarded request.

The sidecar here is what `python -m sidecar` builds: `build_guard` from parsed settings,
served by uvicorn with the traffic listener's protocol (`sidecar.servers.http1`),
in front of an `EchoUpstream` that records every request reaching it. "Never forwarded"
means that record stays empty. Raw sockets throughout: these requests are ones no well-behaved client sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.headers import request_problem
from sidecar.servers.http1 import protocol_class
from sidecar.servers.uvicorn_listener import HEAD_SLACK_BYTES
from tests.support.clients import connection
from tests.support.servers import SERVERS, Server, serve
from tests.support.upstreams import EchoUpstream, RawConnection, RawUpstream

FLAGS = ("--max-header-bytes", "4096", "--max-body", "1000")


def sidecar_app(upstream_port: int, *flags: str) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream_port}", *flags], environ={})
    return build_guard(settings, StreamRegistry())


def listener(header_timeout: float | None = 10.0) -> dict[str, Any]:
    """uvicorn options giving the traffic listener's protocol, as
    `sidecar.servers.uvicorn_listener` does."""
    return {"http": protocol_class(header_timeout, 4096 + HEAD_SLACK_BYTES)}


@pytest.fixture
async def echo() -> AsyncIterator[tuple[int, EchoUpstream]]:
    upstream = EchoUpstream()
    async with serve(upstream) as port:
        yield port, upstream


async def exchange(port: int, raw: bytes, timeout: float = 3.0) -> tuple[int | None, bytes, bool]:
    """Send `raw`, read until the server closes: (status or None, body, closed by the server)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)  # until EOF: the server closed
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    return status, data.partition(b"\r\n\r\n")[2], True


async def still_serving(port: int, upstream: EchoUpstream) -> None:
    before = len(upstream.seen)
    status, body, _ = await exchange(
        port, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 200 and json.loads(body)["raw_path"] == "/ok"
    assert len(upstream.seen) == before + 1


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: client.example\r\n"

MALFORMED = {
    "garbage request line": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    "no version (HTTP/0.9)": b"GET /\r\nHost: x\r\n\r\n",
    "HTTP/2.0 in a text request line": b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
    "space in header name": b"GET / HTTP/1.1\r\nHost: x\r\nX Y: z\r\n\r\n",
    "header without colon": b"GET / HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
    "obsolete line folding": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    "NUL in a header value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "bare CR in a header value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
    "bare LF ends a header": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\nX-B: b\r\n\r\n",
    "two Host headers": b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "no Host on HTTP/1.1": b"GET / HTTP/1.1\r\n\r\n",
}

SMUGGLING = {
    "CL and TE": HEAD + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE and CL": HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n",
    "conflicting CLs": HEAD + b"Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    "CL list": HEAD + b"Content-Length: 4, 5\r\n\r\nabcde",
    "CL with sign": HEAD + b"Content-Length: +4\r\n\r\nabcd",
    "TE not chunked last": HEAD + b"Transfer-Encoding: chunked, identity\r\n\r\nabcd",
    "TE obfuscated": HEAD + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "TE name with space": HEAD + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "HTTP/1.0 with CL and TE": b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_requests_get_400_and_never_reach_the_upstream(
    echo: tuple[int, EchoUpstream], raw: bytes
) -> None:
    """Malformed request lines and headers (CR, LF, NUL, folding, Host count) get 400, not forwarded."""
    upstream_port, upstream = echo
    async with serve(sidecar_app(upstream_port, *FLAGS), **listener()) as port:
        status, _, closed = await exchange(port, raw)
        assert status == 400 and closed
        assert upstream.seen == []
        await still_serving(port, upstream)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("raw", list(SMUGGLING.values()), ids=list(SMUGGLING))
async def test_request_smuggling_is_refused_before_the_upstream(
    echo: tuple[int, EchoUpstream], raw: bytes, server: Server
) -> None:
    """Ambiguous framing (CL+TE, conflicting CL, odd TE) is refused, never forwarded, under every server.

    httptools refuses all of these itself; h11 (uvicorn-h11, hypercorn) lets `CL + TE`
    through, and the proxy's own check answers 400. hypercorn answers 501 to an unknown
    transfer coding, which is as clear.
    """
    upstream_port, upstream = echo
    options = listener() if server == "uvicorn-httptools" else {}
    async with serve(sidecar_app(upstream_port, *FLAGS), server=server, **options) as port:
        status, _, _ = await exchange(port, raw)
        assert status in (400, 501), status
        assert upstream.seen == []
        await still_serving(port, upstream)


async def test_a_broken_chunked_body_aborts_the_upstream_request() -> None:
    """A valid head with a broken chunked body: 400 to the client; the upstream, already
    streaming the body, sees its connection closed before the body's end, never a whole request."""
    heads: list[bytes] = []

    async def handler(connection: RawConnection) -> None:
        heads.append(await connection.read_head())
        await connection.wait_eof()

    raw = RawUpstream(handler)
    async with raw.running(), serve(sidecar_app(raw.port), **listener()) as port:
        status, _, _ = await exchange(
            port, HEAD + b"Transfer-Encoding: chunked\r\n\r\n4;a\nb\r\nabcd\r\n0\r\n\r\n"
        )
        assert status == 400
        if raw.connections:  # the head may have gone upstream: then it must be cut off
            await asyncio.wait_for(raw.connections[0].eof.wait(), 3)
    assert all(b"abcd" not in head for head in heads)


def test_request_problem_rule() -> None:
    """The proxy's own framing check, for servers that pass ambiguous framing through."""
    ok: list[tuple[bytes, bytes]] = [(b"host", b"x"), (b"content-length", b"12")]
    assert request_problem(ok, "1.1") is None
    assert (
        request_problem([(b"host", b"x"), (b"transfer-encoding", b"gzip, chunked")], "1.1") is None
    )
    assert request_problem([], "2") is None  # HTTP/2 carries :authority instead
    assert request_problem([], "1.0") is None
    bad = [
        [(b"host", b"x"), (b"content-length", b"1"), (b"transfer-encoding", b"chunked")],
        [(b"host", b"x"), (b"content-length", b"1"), (b"content-length", b"1")],
        [(b"host", b"x"), (b"content-length", b"-1")],
        [(b"host", b"x"), (b"transfer-encoding", b"chunked, gzip")],
        [(b"host", b"x"), (b"host", b"y")],
        [(b"host", b"x"), (b"x-a", b"a\r\nInjected: 1")],
        [(b"host", b"x"), (b"x-a\x00", b"a")],
        [(b"host", b"x"), (b"x-a", b"a\nb")],
    ]
    for headers in bad:
        assert request_problem(headers, "1.1") is not None, headers
    assert request_problem([], "1.1") is not None


async def test_oversized_headers_431_and_oversized_body_413(echo: tuple[int, EchoUpstream]) -> None:
    """Headers past --max-header-bytes: 431; a head far past it is cut off unread; bodies past --max-body: 413."""
    upstream_port, upstream = echo
    async with serve(sidecar_app(upstream_port, *FLAGS), **listener()) as port:
        status, body, _ = await exchange(port, HEAD + b"X-Big: " + b"y" * 6000 + b"\r\n\r\n")
        assert status == 431 and json.loads(body)["error"]["code"]
        # a head past the protocol's cap (headers + slack): 431 from the listener, closed
        status, _, _ = await exchange(port, HEAD + b"X-H: " + b"z" * 50_000 + b"\r\n")
        assert status == 431
        # a megabyte of headers: the server stops reading and closes long before the end
        async with connection(port) as (reader, writer):
            writer.write(HEAD)
            sent = 0
            with pytest.raises(ConnectionError):
                while sent < 1_000_000:
                    writer.write(b"X-H%d: %s\r\n" % (sent, b"z" * 1000))
                    await writer.drain()
                    sent += 1000
                    with contextlib.suppress(TimeoutError):
                        # a word or EOF from the server
                        await asyncio.wait_for(reader.read(1), 0.002)
                        raise ConnectionResetError("the server answered or closed")
        assert sent < 1_000_000
        big = b'{"x": "' + b"a" * 5000 + b'"}'
        status, body, _ = await exchange(
            port, HEAD + b"Content-Length: %d\r\n\r\n" % len(big) + big
        )
        assert status == 413
        chunked = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        chunked += b"".join(b"400\r\n" + b"b" * 1024 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n"
        status, body, _ = await exchange(port, chunked)
        assert status == 413
        assert all(seen.get("body_length", 0) <= 1000 for seen in upstream.seen)
        await still_serving(port, upstream)


async def test_absolute_form_and_foreign_host_never_change_the_origin(
    echo: tuple[int, EchoUpstream],
) -> None:
    """An absolute-form target or a foreign Host reaches the one upstream, path only, its own Host."""
    upstream_port, upstream = echo
    async with serve(sidecar_app(upstream_port), **listener()) as port:
        raw = (
            b"GET http://evil.example:6666/steal?x=1 HTTP/1.1\r\nHost: evil.example:6666\r\n"
            b"Connection: close\r\n\r\n"
        )
        status, body, _ = await exchange(port, raw)
        seen = json.loads(body)
        raw = b"GET /v1/models HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n"
        status2, body2, _ = await exchange(port, raw)
        seen2 = json.loads(body2)
    assert status == status2 == 200
    assert (seen["raw_path"], seen["query_string"]) == ("/steal", "x=1")
    for record, client_host in ((seen, "evil.example:6666"), (seen2, "169.254.169.254")):
        headers = dict(record["headers"])
        assert headers["host"] == f"127.0.0.1:{upstream_port}"
        assert headers["x-forwarded-host"] == client_host
    assert len(upstream.seen) == 2  # both reached the one configured upstream


@pytest.mark.parametrize(
    "raw",
    [
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
        b"CONNECT / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"TRACE / HTTP/1.1\r\nHost: x\r\nCookie: session=secret\r\n\r\n",
    ],
    ids=["CONNECT authority-form", "CONNECT origin-form", "TRACE"],
)
async def test_connect_and_trace_are_405(echo: tuple[int, EchoUpstream], raw: bytes) -> None:
    """CONNECT and TRACE get 405 with Allow, never a tunnel, never an echo of the request."""
    upstream_port, upstream = echo
    async with serve(sidecar_app(upstream_port), **listener()) as port:
        async with connection(port) as (reader, writer):
            writer.write(raw)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 405") and b"\r\nallow: " in head.lower()
        assert b"secret" not in head
        assert upstream.seen == []
        await still_serving(port, upstream)


async def test_slowloris_is_closed_after_the_header_timeout(echo: tuple[int, EchoUpstream]) -> None:
    """A client trickling its head gets 408 and a closed connection at --header-timeout; so does a
    silent one (closed); a slow but complete head and a stream longer than the timeout are served."""
    upstream_port, upstream = echo
    async with serve(sidecar_app(upstream_port), **listener(header_timeout=0.4)) as port:
        async with connection(port) as (reader, writer):
            t0 = time.monotonic()
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            answer = b""
            for i in range(40):  # one header every 50 ms: 2 s unless the server cuts it
                writer.write(b"X-%d: a\r\n" % i)
                try:  # wait for the server's word between writes, so it is never lost to a reset
                    answer = await asyncio.wait_for(reader.read(1), 0.05)
                    break
                except TimeoutError:
                    continue
            answer += await asyncio.wait_for(reader.read(), 3)
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert 0.35 < took < 1.5, took

        async with connection(port) as (reader, writer):  # says nothing at all
            assert await asyncio.wait_for(reader.read(), 3) == b""

        async with connection(port) as (reader, writer):
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n")  # within the timeout: served
            await asyncio.sleep(0.2)
            writer.write(b"\r\n")
            # then a second request on the kept-alive connection trickles: 408 again
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
            assert head.startswith(b"HTTP/1.1 200")
            writer.write(b"GET /b HTTP/1.1\r\n")
            rest = await asyncio.wait_for(reader.read(), 3)
        assert b"HTTP/1.1 408" in rest

        # a stream that lasts longer than the header timeout is not cut by it
        upstream.gate.put_nowait(b"data: 1\n\n")
        async with connection(port) as (reader, writer):
            writer.write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(0.8)
            upstream.gate.put_nowait(b"data: 2\n\n")
            upstream.gate.put_nowait(None)
            streamed = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 3)
        assert streamed.startswith(b"HTTP/1.1 200") and b"data: 2" in streamed
