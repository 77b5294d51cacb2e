"""The HTTP/1.1 upstream pool (`sidecar.upstream.h1pool.H1Pool` on `sidecar.upstream.h1`) on real sockets:
flow control, response framing, errors, keep-alive reuse, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest
import uvloop

from middleware.errors import UpstreamConnectError, UpstreamProtocolError
from sidecar.upstream.h1 import H1Connection, encode_head
from sidecar.upstream.h1pool import H1Pool
from sidecar.upstream.types import Response
from tests.support.upstreams import RawConnection, RawUpstream, closed_port

MiB = 1024 * 1024
GET_HEADERS = [(b"host", b"upstream")]
CHUNKED_HELLO = b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n"


def answering(*responses: bytes) -> RawUpstream:
    """A raw upstream answering the requests of each connection with `responses` in turn,
    then waiting for EOF."""

    async def handler(conn: RawConnection) -> None:
        for response in responses:
            if not await conn.read_head():
                return
            conn.writer.write(response)
            await conn.writer.drain()
        await conn.wait_eof()

    return RawUpstream(handler)


@contextlib.asynccontextmanager
async def pool_for(raw: RawUpstream, **options: float) -> AsyncIterator[H1Pool]:
    pool = H1Pool("127.0.0.1", raw.port, **options)  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        await pool.aclose()


async def fetch(pool: H1Pool, method: bytes = b"GET") -> tuple[Response, bytes]:
    async with pool.exchange(method, b"/", GET_HEADERS) as response:
        body = b"".join([chunk async for chunk in response.body])
    return response, body


class Body:
    """A request body iterator with the proxy's `started` flag."""

    def __init__(self, *parts: bytes) -> None:
        self.parts = list(parts)
        self.started = False

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        if not self.parts:
            raise StopAsyncIteration
        self.started = True
        return self.parts.pop(0)


# --- flow control ----------------------------------------------------------------------


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_reads(monkeypatch)


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every byte `H1Connection` reads from its socket."""
    count = [0]
    original = H1Connection.data_received

    def counting(self: H1Connection, data: bytes) -> None:
        count[0] += len(data)
        original(self, data)

    monkeypatch.setattr(H1Connection, "data_received", counting)
    return count


async def test_a_consumer_that_stops_reading_pauses_the_socket(bytes_read: list[int]) -> None:
    """Pull-based and bounded: with 20 MB on offer and a consumer that takes one chunk and
    stops, the connection pauses reading; the bytes read stay bounded (one chunk list), and
    everything arrives intact once the consumer reads again."""
    size = 20 * MiB
    payload = bytes(range(256)) * (size // 256)

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + payload)
        with contextlib.suppress(ConnectionError):
            await conn.writer.drain()
        await conn.wait_eof()

    async with (
        RawUpstream(handler).running() as raw,
        pool_for(raw) as pool,
        pool.exchange(b"GET", b"/", GET_HEADERS) as response,
    ):
        body = response.body
        first = await anext(body)
        await asyncio.sleep(0.3)  # the upstream keeps offering; nobody reads
        held = bytes_read[0]
        await asyncio.sleep(0.1)
        assert bytes_read[0] == held  # paused: no read while the consumer is away
        assert held <= 2 * MiB
        rest = [chunk async for chunk in body]
    received = first + b"".join(rest)
    assert len(received) == size
    assert received == payload


async def test_each_read_is_delivered_as_one_chunk() -> None:
    """Body bytes received so far come out as one chunk: several chunked-encoding pieces in
    one TCP read are joined, and a later read is a later chunk."""
    pieces = b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n"
    go_on = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        conn.writer.write(head + pieces)
        await go_on.wait()
        conn.writer.write(b"1\r\n!\r\n0\r\n\r\n")
        await conn.wait_eof()

    async with (
        RawUpstream(handler).running() as raw,
        pool_for(raw) as pool,
        pool.exchange(b"GET", b"/", GET_HEADERS) as response,
    ):
        assert await anext(response.body) == b"hello world"
        go_on.set()
        assert [chunk async for chunk in response.body] == [b"!"]


# --- framing -----------------------------------------------------------------------------


FRAMINGS = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED_HELLO, b"hello"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close", b"until close"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
]


@pytest.mark.parametrize(
    ("wire", "body"),
    FRAMINGS,
    ids=["content-length", "chunked", "until-close", "100-continue", "204"],
)
async def test_response_framing(wire: bytes, body: bytes) -> None:
    """Content-Length, chunked and read-until-close bodies arrive whole; informational
    responses are skipped; a 204 has no body."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(wire)
        if b"close" in wire:
            conn.writer.close()
        await conn.wait_eof()

    async with RawUpstream(handler).running() as raw, pool_for(raw) as pool:
        response, received = await fetch(pool)
    assert received == body
    assert response.status == int(wire.rsplit(b"HTTP/1.1 ", 1)[1][:3])


async def test_head_response_is_complete_at_its_headers_and_reused() -> None:
    """A response to HEAD ends at its headers despite its Content-Length, and its connection
    serves the next request."""
    raw = answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )
    async with raw.running(), pool_for(raw) as pool:
        head, body = await fetch(pool, b"HEAD")
        assert (head.status, body) == (200, b"")
        assert (await fetch(pool))[1] == b"ok"
    assert len(raw.connections) == 1


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_truncated_body_raises_protocol_error(wire: bytes) -> None:
    """The upstream closing inside a framed body raises UpstreamProtocolError after the
    bytes that did arrive."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(wire)
        await conn.writer.drain()

    async with RawUpstream(handler).running() as raw, pool_for(raw) as pool:
        received = b""
        with pytest.raises(UpstreamProtocolError, match="middle of the body"):
            async with pool.exchange(b"GET", b"/", GET_HEADERS) as response:
                async for chunk in response.body:
                    received += chunk
        assert received == b"0123456789"
        assert pool.idle_count == 0


@pytest.mark.parametrize(
    "wire",
    [b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", b""],
    ids=["not-http", "bad-length", "closed-silently"],
)
async def test_invalid_or_missing_response_raises_protocol_error(wire: bytes) -> None:
    """Invalid HTTP, or a close without a response, raises UpstreamProtocolError."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(wire)
        await conn.writer.drain()

    async with RawUpstream(handler).running() as raw, pool_for(raw) as pool:
        with pytest.raises(UpstreamProtocolError):
            await fetch(pool)


async def test_oversized_response_head_raises_protocol_error() -> None:
    """Response headers past MAX_HEAD_BYTES raise UpstreamProtocolError (no unbounded head)."""
    raw = answering(b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"z" * 70000 + b"\r\n\r\n")
    async with raw.running(), pool_for(raw) as pool:
        with pytest.raises(UpstreamProtocolError, match="exceed"):
            await fetch(pool)


# --- connections -------------------------------------------------------------------------


async def test_connection_is_reused_and_not_after_close_or_http10() -> None:
    """Sequential exchanges share a keep-alive connection; `Connection: close` and HTTP/1.0
    responses are not reused."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    raw = answering(ok, ok, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    async with raw.running(), pool_for(raw) as pool:
        for _ in range(3):
            assert (await fetch(pool))[1] == b"ok"
        assert len(raw.connections) == 1
        assert pool.idle_count == 0
    raw = answering(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", ok)
    async with raw.running(), pool_for(raw) as pool:
        await fetch(pool)
        await fetch(pool)
    assert len(raw.connections) == 2


async def test_a_second_unasked_response_is_not_read_and_not_reused() -> None:
    """Bytes past the end of the response (a second response nobody asked for) never reach
    the body, and the connection is not reused."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    raw = answering(ok + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra", ok)
    async with raw.running(), pool_for(raw) as pool:
        assert (await fetch(pool))[1] == b"ok"
        assert (await fetch(pool))[1] == b"ok"
    assert len(raw.connections) == 2


async def test_idle_connection_closed_by_upstream_is_not_used() -> None:
    """An idle connection the upstream closed is dropped from the pool: the next request goes
    out on a fresh connection without an error."""

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if len(raw.connections) == 1:
            conn.writer.close()  # closes right after answering, keep-alive notwithstanding
            return
        await conn.wait_eof()

    raw = RawUpstream(handler)
    async with raw.running(), pool_for(raw) as pool:
        await fetch(pool)
        await asyncio.wait_for(raw.connections[0].writer.wait_closed(), 5)
        for _ in range(100):  # the close reaches the pool's connection
            if pool._idle[0].lost:
                break
            await asyncio.sleep(0.01)
        assert (await fetch(pool))[1] == b"ok"
    assert len(raw.connections) == 2


@pytest.mark.parametrize("started", [False, True], ids=["no-body", "body-started"])
async def test_stale_reused_connection_is_retried_once_when_safe(started: bool) -> None:
    """A reused connection closed without an answer is retried on a fresh one when no body
    byte was taken; once the body was started, the error is raised instead."""
    served: list[int] = []

    async def handler(conn: RawConnection) -> None:
        first = not served
        while await conn.read_head():
            if first and served:
                conn.writer.close()  # the keep-alive race: closes instead of answering
                return
            served.append(1)
            conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await conn.writer.drain()

    raw = RawUpstream(handler)
    async with raw.running(), pool_for(raw) as pool:
        await fetch(pool)
        body = Body(b"data") if started else Body()
        headers = [*GET_HEADERS, (b"content-length", b"4" if started else b"0")]
        with contextlib.ExitStack() as stack:
            if started:
                stack.enter_context(pytest.raises(UpstreamProtocolError))
            async with pool.exchange(b"POST", b"/", headers, body) as response:
                assert b"".join([c async for c in response.body]) == b"ok"
    assert len(raw.connections) == (1 if started else 2)


async def test_request_body_framing_on_the_wire() -> None:
    """A chunked request body is chunk-encoded with its terminator; a Content-Length body
    goes as is; the head and first chunk leave in one write."""
    seen: list[bytes] = []

    async def handler(conn: RawConnection) -> None:
        while head := await conn.read_head():
            length = 4 if b"content-length" in head else len(b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
            seen.append(head + await conn.reader.readexactly(length))
            conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    async with RawUpstream(handler).running() as raw, pool_for(raw) as pool:
        chunked = [*GET_HEADERS, (b"transfer-encoding", b"chunked")]
        async with pool.exchange(b"POST", b"/c", chunked, Body(b"ab", b"cd")) as response:
            assert [c async for c in response.body] == []
        length = [*GET_HEADERS, (b"content-length", b"4")]
        async with pool.exchange(b"PUT", b"/l", length, Body(b"ab", b"cd")) as response:
            assert [c async for c in response.body] == []
    assert seen[0].endswith(b"\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
    assert seen[0].startswith(b"POST /c HTTP/1.1\r\nhost: upstream\r\n")
    assert seen[1].endswith(b"content-length: 4\r\n\r\nabcd")


def test_header_with_newline_is_refused() -> None:
    """CR or LF anywhere inside a header name, value or the target never reaches the wire;
    a head without headers is the request line and the blank line."""
    for bad in ([(b"x", b"a\r\nInjected: 1")], [(b"x\r", b"a")], [(b"x", b"\n")]):
        with pytest.raises(UpstreamProtocolError):
            encode_head(b"GET", b"/", bad)
    for target in (b"/\n", b"/\r", b"/\r\n"):
        with pytest.raises(UpstreamProtocolError):
            encode_head(b"GET", target, [])
    assert encode_head(b"GET", b"/", [(b"a", b"b")]) == b"GET / HTTP/1.1\r\na: b\r\n\r\n"
    assert encode_head(b"GET", b"/", []) == b"GET / HTTP/1.1\r\n\r\n"
    two = encode_head(b"POST", b"/x", [(b"a", b"1"), (b"b", b"")])
    assert two == b"POST /x HTTP/1.1\r\na: 1\r\nb: \r\n\r\n"


async def test_connection_refused_and_connect_timeout() -> None:
    """Refused and timed-out connects raise UpstreamConnectError."""
    pool = H1Pool("127.0.0.1", closed_port())
    with pytest.raises(UpstreamConnectError, match="could not connect"):
        await fetch(pool)
    # A listener whose accept queue is full drops SYNs: the connect hangs until the timeout.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        try:
            pool = H1Pool("127.0.0.1", port, connect_timeout=0.2)
            with pytest.raises(UpstreamConnectError, match="timed out"):
                await fetch(pool)
        finally:
            for filler in fillers:
                filler.close()


# --- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before-headers", "mid-body"])
async def test_cancellation_closes_the_connection_within_50_ms(when: str) -> None:
    """Cancelling the task inside an exchange aborts the connection: the upstream sees the
    close within 50 ms, and the connection is not pooled."""
    got_request = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        if when == "mid-body":
            conn.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        got_request.set()
        await conn.wait_eof()

    first_chunk = asyncio.Event()

    async def consume(pool: H1Pool) -> None:
        async with pool.exchange(b"GET", b"/", GET_HEADERS) as response:
            async for _ in response.body:
                first_chunk.set()

    async with RawUpstream(handler).running() as raw, pool_for(raw) as pool:
        task = asyncio.create_task(consume(pool))
        await asyncio.wait_for(got_request.wait(), 5)
        if when == "mid-body":
            await asyncio.wait_for(first_chunk.wait(), 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(raw.connections[0].eof.wait(), 1)
        assert pool.idle_count == 0
    eof_at = raw.connections[0].eof_at
    assert eof_at is not None
    assert eof_at - cancelled_at < 0.05


async def test_leaving_the_exchange_before_the_body_ends_does_not_pool() -> None:
    """An exchange left normally with its body unread closes its connection."""
    raw = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
    async with raw.running(), pool_for(raw) as pool:
        async with pool.exchange(b"GET", b"/", GET_HEADERS) as response:
            assert response.status == 200
        await asyncio.wait_for(raw.connections[0].eof.wait(), 1)
        assert pool.idle_count == 0


# --- uvloop ------------------------------------------------------------------------------


def test_the_same_rules_hold_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar serves on uvloop, whose transports differ from asyncio's (not
    `asyncio.Transport` subclasses, other read sizes): flow control, framing, truncation,
    reuse, the stale retry and cancellation hold there too."""

    async def scenarios() -> None:
        await test_a_consumer_that_stops_reading_pauses_the_socket(count_reads(monkeypatch))
        await test_each_read_is_delivered_as_one_chunk()
        for wire, body in FRAMINGS:
            await test_response_framing(wire, body)
        await test_head_response_is_complete_at_its_headers_and_reused()
        await test_truncated_body_raises_protocol_error(
            b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n0123456789"
        )
        await test_connection_is_reused_and_not_after_close_or_http10()
        await test_a_second_unasked_response_is_not_read_and_not_reused()
        await test_idle_connection_closed_by_upstream_is_not_used()
        await test_stale_reused_connection_is_retried_once_when_safe(started=False)
        await test_request_body_framing_on_the_wire()
        await test_connection_refused_and_connect_timeout()
        for when in ("before-headers", "mid-body"):
            await test_cancellation_closes_the_connection_within_50_ms(when)

    uvloop.run(scenarios())


async def test_a_read_with_no_body_byte_keeps_the_consumer_waiting() -> None:
    """A read that holds only a chunk-size line (no body byte yet) must not drop the waiting
    consumer: the body byte that follows in a later read still reaches it."""
    step = asyncio.Event()

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await step.wait()
        conn.writer.write(b"5\r\n")  # the size line alone
        await conn.writer.drain()
        await asyncio.sleep(0.05)
        conn.writer.write(b"hello\r\n0\r\n\r\n")
        await conn.wait_eof()

    async with (
        RawUpstream(handler).running() as raw,
        pool_for(raw) as pool,
        pool.exchange(b"GET", b"/", GET_HEADERS) as response,
    ):
        pending = asyncio.ensure_future(anext(response.body))
        await asyncio.sleep(0.01)  # the consumer is waiting before any body read arrives
        step.set()
        async with asyncio.timeout(2):
            assert await pending == b"hello"
            assert [chunk async for chunk in response.body] == []


async def _nodelay_of_a_pooled_connection() -> int:
    raw = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    async with raw.running(), pool_for(raw) as pool:
        conn = await pool.connect()
        try:
            sock = conn.transport.get_extra_info("socket") if conn.transport else None
            assert sock is not None
            return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        finally:
            conn.abort()


def test_upstream_connections_send_small_writes_at_once() -> None:
    """An upstream TCP connection has Nagle's algorithm off (TCP_NODELAY), on asyncio's loop
    and on uvloop: a small request write is not held back waiting for an ACK."""
    assert asyncio.run(_nodelay_of_a_pooled_connection()) != 0
    assert uvloop.run(_nodelay_of_a_pooled_connection()) != 0
