"""The one upstream origin: URL parsing, the `Pool` interface, and the pool per scheme.

HTTP/1.1 (`http://`, `unix:`) runs on `sidecar.h1pool.H1Pool`, an asyncio protocol on
httptools; HTTP/2 prior knowledge (`h2c://`) runs on httpcore here.

Deliberately not httpcore's `AsyncConnectionPool`: its `_assign_requests_to_connections`
walks every connection for every request (quadratic; 75% of CPU at 600 concurrent
streams). The HTTP/1.1 pool keeps idle connections in a LIFO deque (O(1) acquire and
release); HTTP/2 multiplexes streams on the newest connection and opens another when that
one is full.

An `Exchange` is an async context manager around one request, yielding a `Response`.
Leaving it normally returns the connection for reuse (when the response was fully read);
leaving it with an exception — cancellation included — closes the HTTP/1.1 connection at
once (a half-read connection is never reused) or ends the HTTP/2 stream (shielded).
"""

from __future__ import annotations

import types
import urllib.parse
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import httpcore
from h2.errors import ErrorCodes

from sidecar.h1 import Headers, Response
from sidecar.h1pool import H1Pool

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
    async def __aenter__(self) -> Response: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None: ...


class Pool(Protocol):
    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> Exchange: ...

    async def aclose(self) -> None: ...


class HTTP2Pool:
    """HTTP/2 prior knowledge: streams share the newest connection until it is full."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_streams_per_connection: int = 100,
        connect_timeout: float = 10.0,
    ) -> None:
        self.upstream = upstream
        self.max_streams_per_connection = max_streams_per_connection
        self.connect_timeout = connect_timeout
        self._backend = httpcore.AnyIOBackend()
        self._active: dict[httpcore.AsyncHTTP2Connection, int] = {}
        self._current: httpcore.AsyncHTTP2Connection | None = None
        self._connect_lock = anyio.Lock()
        self._closed = False

    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> _HTTP2Exchange:
        url = self.upstream.url(target)
        return _HTTP2Exchange(self, httpcore.Request(method, url, headers=headers, content=body))

    def _usable(self, connection: httpcore.AsyncHTTP2Connection | None) -> bool:
        return (
            connection is not None
            and connection.is_available()
            and self._active.get(connection, 0) < self.max_streams_per_connection
        )

    async def acquire(self) -> httpcore.AsyncHTTP2Connection:
        if not self._usable(self._current):
            async with self._connect_lock:
                if not self._usable(self._current):
                    stream = await _connect(self.upstream, self._backend, self.connect_timeout)
                    self._current = httpcore.AsyncHTTP2Connection(self.upstream.origin, stream)
                    self._active[self._current] = 0
        assert self._current is not None
        self._active[self._current] += 1
        return self._current

    async def release(self, connection: httpcore.AsyncHTTP2Connection) -> None:
        left = self._active[connection] - 1
        self._active[connection] = left
        if left == 0 and (connection is not self._current or not connection.is_available()):
            del self._active[connection]
            if connection is self._current:
                self._current = None
            with anyio.CancelScope(shield=True):
                await connection.aclose()

    async def aclose(self) -> None:
        self._closed = True
        with anyio.CancelScope(shield=True):
            for connection in list(self._active):
                await connection.aclose()
        self._active.clear()
        self._current = None


class _HTTP2Exchange:
    __slots__ = ("_connection", "_pool", "_request", "_response")

    def __init__(self, pool: HTTP2Pool, request: httpcore.Request) -> None:
        self._pool = pool
        self._request = request
        self._connection: httpcore.AsyncHTTP2Connection | None = None
        self._response: httpcore.Response | None = None

    async def __aenter__(self) -> Response:
        connection = await self._pool.acquire()
        self._connection = connection
        try:
            self._response = response = await connection.handle_async_request(self._request)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._pool.release(connection)
            raise
        assert isinstance(response.stream, AsyncIterable)
        return Response(response.status, response.headers, aiter(response.stream))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        assert self._connection is not None and self._response is not None
        with anyio.CancelScope(shield=True):
            if exc_type is not None:
                await _reset_stream(self._connection, self._response, self._request)
            await self._response.aclose()
            await self._pool.release(self._connection)


async def _reset_stream(
    connection: httpcore.AsyncHTTP2Connection,
    response: httpcore.Response,
    request: httpcore.Request,
) -> None:
    """Send RST_STREAM(CANCEL) for an abandoned stream: httpcore 1.0.x does not.

    Uses httpcore internals (`_h2_state`, `_write_outgoing_data`); best effort — a
    connection that is already broken needs no reset.
    """
    stream_id = response.extensions.get("stream_id")
    if stream_id is None or not connection.is_available():
        return
    try:
        connection._h2_state.reset_stream(stream_id, ErrorCodes.CANCEL)
        await connection._write_outgoing_data(request)
    except Exception:
        return


def make_pool(upstream: Upstream, *, connect_timeout: float = 10.0, max_idle: int = 256) -> Pool:
    """The connection manager for an upstream: HTTP/1.1 for http/unix, HTTP/2 for h2c."""
    if upstream.scheme == "h2c":
        return HTTP2Pool(upstream, connect_timeout=connect_timeout)
    return H1Pool(
        upstream.host,
        upstream.port,
        path=upstream.path,
        connect_timeout=connect_timeout,
        max_idle=max_idle,
    )
