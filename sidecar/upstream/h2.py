"""The HTTP/2 upstream (`h2c://` prior knowledge, or `https://` when the upstream chose h2 by
ALPN): a pool of multiplexed connections.

Each connection is `httpcore_internals.Connection`: httpcore's HTTP/2 connection with
`RST_STREAM(CANCEL)` for abandoned streams and a bounded receive window per stream (see
there for why, and for the httpcore versions it was checked against). This module uses
only its public surface.

Each stream's receive window is `STREAM_WINDOW` (256 KiB), not httpcore's 16 MiB: it is
what bounds the frames buffered for one slow client's stream and pauses the upstream for
that stream alone.
"""

from __future__ import annotations

import ssl
import types
from collections.abc import AsyncIterable

import anyio
import httpcore

from middleware.errors import UpstreamConnectError
from sidecar.upstream.errors import UpstreamTimeout
from sidecar.upstream.h2c import WatchingBackend
from sidecar.upstream.httpcore_internals import Connection
from sidecar.upstream.tls import tls_error
from sidecar.upstream.types import Headers, Response, Upstream

STREAM_WINDOW = 256 * 1024


def _scheme(upstream: Upstream) -> bytes:
    return b"https" if upstream.scheme == "https" else b"http"


def _origin(upstream: Upstream) -> httpcore.Origin:
    return httpcore.Origin(_scheme(upstream), upstream.host.encode("ascii"), upstream.port)


def _url(upstream: Upstream, target: bytes) -> httpcore.URL:
    return httpcore.URL(
        scheme=_scheme(upstream),
        host=upstream.host.encode("ascii"),
        port=upstream.port,
        target=target,
    )


async def connect(
    backend: httpcore.AsyncNetworkBackend,
    upstream: Upstream,
    timeout: float,
    ssl_context: ssl.SSLContext | None = None,
) -> httpcore.AsyncNetworkStream:
    """A TCP connection to the upstream, with TLS over it when `ssl_context` is given (SNI
    and the hostname check use the upstream's host); `timeout` bounds both. Failures are
    raised as `UpstreamTimeout`, `UpstreamTLSError` or `UpstreamConnectError`."""
    where = f"{upstream.host}:{upstream.port}"
    try:
        with anyio.fail_after(timeout):
            stream = await backend.connect_tcp(upstream.host, upstream.port)
            if ssl_context is not None:
                try:
                    stream = await stream.start_tls(ssl_context, server_hostname=upstream.host)
                except BaseException:
                    await stream.aclose()
                    raise
    except (TimeoutError, httpcore.ConnectTimeout):
        message = f"timed out connecting to the upstream {where} ({timeout} s)"
        raise UpstreamTimeout(message) from None
    except httpcore.ConnectError as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ssl.SSLError):
            cause = cause.__cause__  # anyio wraps an EOF in the handshake once more
        if cause is not None:
            raise tls_error(where, cause) from None
        raise UpstreamConnectError(f"could not connect to the upstream {where}: {exc}") from exc
    return stream


class HTTP2Pool:
    """HTTP/2 prior knowledge: streams share the newest connection until it is full."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_streams_per_connection: int = 100,
        connect_timeout: float = 10.0,
        stream_window: int = STREAM_WINDOW,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.upstream = upstream
        self.ssl_context = ssl_context
        self.max_streams_per_connection = max_streams_per_connection
        self.connect_timeout = connect_timeout
        self.stream_window = stream_window
        # h2c: prior knowledge, so an HTTP/1.1-only upstream is named as such (`h2c`)
        h2c = upstream.scheme == "h2c"
        self._backend = WatchingBackend() if h2c else httpcore.AnyIOBackend()
        self._active: dict[Connection, int] = {}
        self._current: Connection | None = None
        self._connect_lock = anyio.Lock()
        self._closed = False

    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> HTTP2Exchange:
        url = _url(self.upstream, target)
        return HTTP2Exchange(self, httpcore.Request(method, url, headers=headers, content=body))

    @property
    def connections(self) -> list[Connection]:
        return list(self._active)

    def _usable(self, connection: Connection | None) -> bool:
        return (
            connection is not None
            and connection.is_available()
            and self._active.get(connection, 0) < self.max_streams_per_connection
        )

    async def acquire(self) -> Connection:
        if not self._usable(self._current):
            async with self._connect_lock:
                if not self._usable(self._current):
                    await self._retire(self._current)
                    stream = await connect(
                        self._backend, self.upstream, self.connect_timeout, self.ssl_context
                    )
                    self._current = Connection(
                        _origin(self.upstream), stream, stream_window=self.stream_window
                    )
                    self._active[self._current] = 0
        assert self._current is not None
        self._active[self._current] += 1
        return self._current

    async def _retire(self, connection: Connection | None) -> None:
        """Stop starting streams on `connection`; close it now when none is left on it."""
        if connection is None:
            return
        if connection is self._current:
            self._current = None
        if self._active.get(connection, 0) == 0:
            self._active.pop(connection, None)
            with anyio.CancelScope(shield=True):
                await connection.aclose()

    async def release(self, connection: Connection) -> None:
        left = self._active[connection] - 1
        self._active[connection] = left
        if left == 0 and (connection is not self._current or not connection.is_available()):
            await self._retire(connection)

    async def aclose(self) -> None:
        self._closed = True
        with anyio.CancelScope(shield=True):
            for connection in list(self._active):
                await connection.aclose()
        self._active.clear()
        self._current = None


class HTTP2Exchange:
    """One request on the pool. Leaving with an exception resets the stream (the connection
    does it when the response is closed), never the connection."""

    __slots__ = ("_connection", "_pool", "_request", "_response")

    def __init__(self, pool: HTTP2Pool, request: httpcore.Request) -> None:
        self._pool = pool
        self._request = request
        self._connection: Connection | None = None
        self._response: httpcore.Response | None = None

    async def __aenter__(self) -> Response:
        for attempt in (1, 2):
            connection = await self._pool.acquire()
            self._connection = connection
            try:
                self._response = await connection.handle_async_request(self._request)
            except httpcore.ConnectionNotAvailable:
                # GOAWAY named an earlier last stream: this one was not processed. Send it
                # again on a fresh connection, once, when no body byte was taken yet.
                await self._release(connection)
                if attempt == 2 or getattr(self._request.stream, "started", True):
                    raise
            except BaseException:
                await self._release(connection)
                raise
            else:
                stream = self._response.stream
                assert isinstance(stream, AsyncIterable)
                return Response(self._response.status, self._response.headers, aiter(stream))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _release(self, connection: Connection) -> None:
        with anyio.CancelScope(shield=True):
            await self._pool.release(connection)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        assert self._connection is not None and self._response is not None
        with anyio.CancelScope(shield=True):
            await self._response.aclose()  # resets the stream when it is still open
            await self._pool.release(self._connection)
