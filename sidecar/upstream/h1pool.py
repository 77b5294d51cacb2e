"""The HTTP/1.1 keep-alive pool: idle `H1Connection`s in a LIFO deque, O(1) both ways.

An exchange is an async context manager around one request. Its `__aenter__` sends the
request (head plus the first body chunk in one write, then the rest with write-side flow
control) and returns the `Response` once its headers are in. Leaving it normally, with
the response complete and keep-alive allowed, returns the connection to the pool; leaving
it any other way — an exception, a cancellation, a body not read to its end — aborts the
connection synchronously, before any await, so the upstream sees the close at once.

With an `ssl_context` (`https://` upstreams that chose HTTP/1.1 by ALPN) the same protocol
runs over asyncio's TLS transport: it sees plaintext in `data_received`, so the read-callback
fast path is unchanged.

A reused connection that fails before any response byte, while no request body byte has
been taken from the client, is retried once on a fresh connection: the keep-alive race
(the upstream closed it as we sent), when sending again is still safe.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import types
from collections.abc import AsyncIterable, AsyncIterator
from time import monotonic

from middleware.errors import UpstreamConnectError, UpstreamProtocolError
from sidecar.upstream.errors import UpstreamTimeout
from sidecar.upstream.framing import CHUNKED, check_end, check_piece, request_framing
from sidecar.upstream.h1 import Body, H1Connection, encode_head
from sidecar.upstream.tls import tls_error
from sidecar.upstream.types import Headers, Response


class H1Pool:
    """HTTP/1.1 connections to `host:port`, or to the unix socket at `path` when given."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        path: str | None = None,
        max_idle: int = 256,
        connect_timeout: float = 10.0,
        keepalive_expiry: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.path = path
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self.keepalive_expiry = keepalive_expiry
        self.ssl_context = ssl_context
        self._idle: collections.deque[H1Connection] = collections.deque()
        self._closed = False

    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> H1Exchange:
        """One request: `headers` must carry the framing (Content-Length or chunked)."""
        return H1Exchange(self, method, target, headers, body)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().abort()

    def take_idle(self) -> H1Connection | None:
        """The most recently used live idle connection, or None."""
        # time.monotonic (a vDSO read), not the loop's time: asyncio.get_running_loop() makes
        # a getpid() system call, here twice per request (release too).
        now = monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.dead and now - conn.idle_since < self.keepalive_expiry:
                return conn
            conn.abort()
        return None

    async def connect(self) -> H1Connection:
        loop = asyncio.get_running_loop()
        where = f"unix:{self.path}" if self.path is not None else f"{self.host}:{self.port}"
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.path is not None:
                    _, conn = await loop.create_unix_connection(H1Connection, self.path)
                elif self.ssl_context is not None:
                    _, conn = await loop.create_connection(
                        H1Connection,
                        self.host,
                        self.port,
                        ssl=self.ssl_context,
                        server_hostname=self.host,
                    )
                else:
                    _, conn = await loop.create_connection(H1Connection, self.host, self.port)
        except TimeoutError:
            message = f"timed out connecting to the upstream {where} ({self.connect_timeout} s)"
            raise UpstreamTimeout(message) from None
        except ssl.SSLError as exc:  # before OSError, its base class
            raise tls_error(where, exc) from None
        except OSError as exc:
            raise UpstreamConnectError(f"could not connect to the upstream {where}: {exc}") from exc
        return conn

    def release(self, conn: H1Connection) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            conn.abort()
            return
        now = monotonic()
        conn.finish(now)
        self._idle.append(conn)
        # LIFO leaves the oldest idle connection at the bottom: check one per release, so
        # connections the upstream closed or that expired do not linger there (still O(1)).
        bottom = self._idle[0]
        if bottom.dead or now - bottom.idle_since >= self.keepalive_expiry:
            self._idle.popleft().abort()


class H1Exchange:
    """One request and its response on a pooled connection. The request's framing is
    decided from its head once (`request_framing`) and every body byte is held to it."""

    __slots__ = ("_body", "_conn", "_framing", "_head", "_method", "_pool")

    def __init__(
        self,
        pool: H1Pool,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None,
    ) -> None:
        self._pool = pool
        self._method = method
        self._head = encode_head(method, target, headers)
        self._framing = request_framing(headers)
        self._body = body
        self._conn: H1Connection | None = None

    async def __aenter__(self) -> Response:
        rest = None if self._body is None else aiter(self._body)
        first = None if rest is None else await anext(rest, None)
        conn = self._pool.take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._pool.connect()
        self._conn = conn
        try:
            await self._send(conn, first, rest)
        except UpstreamProtocolError:
            conn.abort()
            if not reused or conn.received or getattr(self._body, "started", first is not None):
                raise
            self._conn = conn = await self._pool.connect()
            try:
                await self._send(conn, first, rest)
            except BaseException:
                conn.abort()
                raise
        except BaseException:
            conn.abort()
            raise
        # Sent whole, so not needed again: not held while the response streams, nor are the
        # response's headers (the Response has them; the proxy drops it once they are sent).
        self._head, self._body = b"", None
        headers, conn.headers = conn.headers, []
        return Response(conn.status, headers, Body(conn))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        conn = self._conn
        assert conn is not None
        if exc_type is None and conn.reusable():
            self._pool.release(conn)
        else:
            conn.abort()

    async def _send(
        self, conn: H1Connection, first: bytes | None, rest: AsyncIterator[bytes] | None
    ) -> None:
        framing = self._framing
        chunked = framing == CHUNKED
        if first is None:
            check_end(framing, 0)
            conn.begin(self._method)
            conn.write(self._head + b"0\r\n\r\n" if chunked else self._head)
        else:
            check_piece(framing, 0, len(first))
            conn.begin(self._method)
            conn.write(self._head + (_chunk(first) if chunked else first))
            sent = len(first)
            assert rest is not None
            async for chunk in rest:
                if conn.dead:  # the upstream may have answered early: read that below
                    break
                check_piece(framing, sent, len(chunk))
                sent += len(chunk)
                conn.write(_chunk(chunk) if chunked else chunk)
                if conn.write_paused:
                    await conn.drain()
            if not conn.dead:
                check_end(framing, sent)
            if chunked and not conn.dead:
                conn.write(b"0\r\n\r\n")
        conn.request_done = not conn.dead
        while not conn.head_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
