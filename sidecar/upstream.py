"""The one upstream origin: URL parsing, connections, and one request/response exchange.

Deliberately not httpcore's `AsyncConnectionPool`: its `_assign_requests_to_connections`
walks every connection for every request (quadratic; 75% of CPU at 600 concurrent
streams). Here an HTTP/1.1 pool is a LIFO deque of idle connections, so acquiring and
releasing cost O(1) however many streams are active; HTTP/2 multiplexes streams on the
newest connection and opens another when that one is full.

An `Exchange` is an async context manager around one request. Leaving it normally returns
the connection for reuse (when the response was fully read); leaving it with an exception
— cancellation included — closes the HTTP/1.1 connection at once (a half-read connection
is never reused) or ends the HTTP/2 stream. That cleanup runs shielded.
"""

from __future__ import annotations

import collections
import types
import urllib.parse
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import httpcore

from sidecar.h2 import HTTP2Pool

Scheme = Literal["http", "h2c", "unix"]

_SCHEMES: tuple[Scheme, ...] = ("http", "h2c", "unix")


@dataclass(frozen=True)
class Upstream:
    """Where the proxy sends every request: `http://host:port`, `h2c://host:port`, `unix:/path`."""

    scheme: Scheme
    host: str = "localhost"
    port: int = 80
    path: str | None = None

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """Parse an upstream URL; ValueError says what is wrong with it."""
        if url.startswith("unix:"):
            path = url[len("unix:") :]
            if path.startswith("//"):
                path = path[2:]
            if not path.startswith("/"):
                raise ValueError(f"upstream {url!r}: a unix socket needs an absolute path")
            return cls("unix", path=path)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "h2c"):
            raise ValueError(
                f"upstream {url!r}: scheme must be one of "
                + ", ".join(f"{s}:" for s in _SCHEMES)
                + (" (TLS to the upstream is not supported)" if parts.scheme == "https" else "")
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"upstream {url!r}: must be an origin, without path or query")
        if parts.username or parts.password:
            raise ValueError(f"upstream {url!r}: must not carry credentials")
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError(f"upstream {url!r}: the port is not a number in 1-65535") from None
        if not parts.hostname:
            raise ValueError(f"upstream {url!r}: the host is missing")
        return cls("http" if parts.scheme == "http" else "h2c", parts.hostname, port)

    @property
    def authority(self) -> bytes:
        """The `Host` header the upstream gets."""
        if self.scheme == "unix":
            return b"localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}".encode("ascii")

    @property
    def origin(self) -> httpcore.Origin:
        return httpcore.Origin(b"http", self.host.encode("ascii"), self.port)

    def url(self, target: bytes) -> httpcore.URL:
        return httpcore.URL(
            scheme=b"http", host=self.host.encode("ascii"), port=self.port, target=target
        )

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        return f"{self.scheme}://{self.authority.decode()}"


async def _connect(
    upstream: Upstream, backend: httpcore.AsyncNetworkBackend, connect_timeout: float
) -> httpcore.AsyncNetworkStream:
    if upstream.path is not None:
        return await backend.connect_unix_socket(upstream.path, timeout=connect_timeout)
    return await backend.connect_tcp(upstream.host, upstream.port, timeout=connect_timeout)


class Exchange(Protocol):
    async def __aenter__(self) -> httpcore.Response: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None: ...


class Pool(Protocol):
    def exchange(self, request: httpcore.Request) -> Exchange: ...

    async def aclose(self) -> None: ...


class HTTP11Pool:
    """Idle HTTP/1.1 connections in a LIFO deque: O(1) acquire and release."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_idle: int = 256,
        connect_timeout: float = 10.0,
        keepalive_expiry: float | None = 4.0,
    ) -> None:
        self.upstream = upstream
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self.keepalive_expiry = keepalive_expiry
        self._backend = httpcore.AnyIOBackend()
        self._idle: collections.deque[httpcore.AsyncHTTP11Connection] = collections.deque()
        self._closed = False

    def exchange(self, request: httpcore.Request) -> _HTTP11Exchange:
        return _HTTP11Exchange(self, request)

    async def acquire(self) -> tuple[httpcore.AsyncHTTP11Connection, bool]:
        """A connection and whether it was reused (a fresh one is connected when none is idle)."""
        while self._idle:
            connection = self._idle.pop()
            if connection.is_available() and not connection.has_expired():
                return connection, True
            with anyio.CancelScope(shield=True):
                await connection.aclose()
        stream = await _connect(self.upstream, self._backend, self.connect_timeout)
        return (
            httpcore.AsyncHTTP11Connection(self.upstream.origin, stream, self.keepalive_expiry),
            False,
        )

    async def release(self, connection: httpcore.AsyncHTTP11Connection) -> None:
        if connection.is_idle() and not self._closed and len(self._idle) < self.max_idle:
            self._idle.append(connection)
        elif not connection.is_closed():
            await connection.aclose()
        # LIFO leaves the oldest idle connection at the bottom: check one per release, so
        # connections the upstream has closed do not linger there (still O(1)).
        if len(self._idle) > 1 and self._idle[0].has_expired():
            await self._idle.popleft().aclose()

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        self._closed = True
        with anyio.CancelScope(shield=True):
            while self._idle:
                await self._idle.pop().aclose()


class _HTTP11Exchange:
    __slots__ = ("_connection", "_pool", "_request", "_response")

    def __init__(self, pool: HTTP11Pool, request: httpcore.Request) -> None:
        self._pool = pool
        self._request = request
        self._connection: httpcore.AsyncHTTP11Connection | None = None
        self._response: httpcore.Response | None = None

    async def __aenter__(self) -> httpcore.Response:
        connection, reused = await self._pool.acquire()
        self._connection = connection
        try:
            self._response = await connection.handle_async_request(self._request)
        except (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError):
            await _abort(connection)
            if not reused or not _untouched(self._request):
                raise
            # The upstream closed an idle keep-alive connection as we reused it, and no
            # byte of the body was taken: the request is safe to send again, once.
            connection, _ = await self._pool.acquire()
            self._connection = connection
            try:
                self._response = await connection.handle_async_request(self._request)
            except BaseException:
                await _abort(connection)
                raise
        except BaseException:
            await _abort(connection)
            raise
        return self._response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        assert self._connection is not None and self._response is not None
        if exc_type is not None:
            await _abort(self._connection)
            return
        with anyio.CancelScope(shield=True):
            # Makes the connection idle when both sides are done, else closes it.
            await self._response.aclose()
            await self._pool.release(self._connection)


def _untouched(request: httpcore.Request) -> bool:
    started = getattr(request.stream, "started", True)
    return not started


async def _abort(connection: httpcore.AsyncConnectionInterface) -> None:
    """Close a connection now. The socket is aborted before the first await inside, so even
    an unshielded cancellation arriving later cannot leave it open."""
    with anyio.CancelScope(shield=True):
        await connection.aclose()


def make_pool(upstream: Upstream, *, connect_timeout: float = 10.0, max_idle: int = 256) -> Pool:
    """The connection manager for an upstream: HTTP/1.1 for http/unix, HTTP/2 for h2c."""
    if upstream.scheme == "h2c":
        return HTTP2Pool(upstream, connect_timeout=connect_timeout)
    return HTTP11Pool(upstream, connect_timeout=connect_timeout, max_idle=max_idle)
