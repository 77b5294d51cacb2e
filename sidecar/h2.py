"""The HTTP/2 upstream (`h2c://`, prior knowledge): a pool of multiplexed connections, on an
httpcore connection that ends abandoned streams properly.

httpcore 1.0.x never resets a stream whose response is closed early (encode/httpcore#1022;
the fix proposed upstream is PR #1098): `_response_closed` frees httpcore's own stream slot
but h2 still counts the stream as open, the upstream keeps generating for nobody, and after
enough cancellations h2 refuses new streams with `Max outbound streams is 100, 100 open`
on a connection that is nearly idle. `Connection` overrides that one step: a stream still
open in h2 is reset with `RST_STREAM(CANCEL)` first — synchronously, so no cancellation can
come between — and the frame is flushed at once. This covers both early exits: a request
abandoned before its response headers (httpcore's own `except` path) and a response closed
mid-body.

Deliberate surprises (do not "fix"):
- The flush after a reset waits for the write lock at most `FLUSH_TIMEOUT`: the lock may
  be held by a stream blocked on a full socket. Past that the frame stays queued in h2 and
  leaves with the next write; the stream counts are already right either way.
- Each stream's receive window is `stream_window` (256 KiB), not httpcore's 16 MiB: httpcore
  acknowledges data only when the stream's reader takes it, so the window is what bounds
  the frames buffered for a stream whose client is slow — and what pauses the upstream for
  that stream alone. The connection window stays large, so one slow stream cannot stall
  the others.
- Uses httpcore 1.0.x internals (`_h2_state`, `_write_lock`, `_network_stream`,
  `_send_request_headers`, `_response_closed`); tests/test_http2.py fails if they move.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING

import anyio
import h2.exceptions
import httpcore
from h2.errors import ErrorCodes
from httpcore._async.http2 import has_body_headers

from sidecar.h1 import Headers, Response

if TYPE_CHECKING:
    from sidecar.upstream import Upstream

STREAM_WINDOW = 256 * 1024
FLUSH_TIMEOUT = 1.0
_DEFAULT_WINDOW = 65535  # RFC 9113 initial window; httpcore leaves SETTINGS at the default


class Connection(httpcore.AsyncHTTP2Connection):
    """httpcore's HTTP/2 connection, with `RST_STREAM(CANCEL)` for abandoned streams and a
    bounded receive window per stream."""

    def __init__(
        self,
        origin: httpcore.Origin,
        stream: httpcore.AsyncNetworkStream,
        *,
        stream_window: int = STREAM_WINDOW,
    ) -> None:
        super().__init__(origin, stream)
        self.stream_window = stream_window
        self.resets_sent = 0

    @property
    def open_streams(self) -> int:
        """Streams h2 counts as open towards the upstream (what `Max outbound streams` checks)."""
        return int(self._h2_state.open_outbound_streams)

    async def _send_request_headers(self, request: httpcore.Request, stream_id: int) -> None:
        # httpcore's version, with the stream window raised to `stream_window` (not 16 MiB).
        end_stream = not has_body_headers(request)
        authority = next(v for k, v in request.headers if k.lower() == b"host")
        headers = [
            (b":method", request.method),
            (b":authority", authority),
            (b":scheme", request.url.scheme),
            (b":path", request.url.target),
        ] + [
            (k.lower(), v)
            for k, v in request.headers
            if k.lower() not in (b"host", b"transfer-encoding")
        ]
        self._h2_state.send_headers(stream_id, headers, end_stream=end_stream)
        if self.stream_window > _DEFAULT_WINDOW:
            increment = self.stream_window - _DEFAULT_WINDOW
            self._h2_state.increment_flow_control_window(increment, stream_id=stream_id)
        await self._write_outgoing_data(request)

    async def _response_closed(self, stream_id: int) -> None:
        reset = self._reset_if_open(stream_id)
        await super()._response_closed(stream_id)
        if reset:
            await self._flush()

    def _reset_if_open(self, stream_id: int) -> bool:
        """Reset a stream h2 still holds open; True when a RST_STREAM was queued."""
        stream = self._h2_state.streams.get(stream_id)
        if stream is None or stream.closed:
            return False
        try:
            self._h2_state.reset_stream(stream_id, ErrorCodes.CANCEL)
        except h2.exceptions.ProtocolError:  # the connection itself is closed: nothing to end
            return False
        self.resets_sent += 1
        return True

    async def _flush(self) -> None:
        """Write what h2 has queued, now; bounded wait, never raises (cleanup path)."""
        if self._write_exception is not None or self.is_closed():
            return
        with anyio.move_on_after(FLUSH_TIMEOUT):
            async with self._write_lock:
                data = self._h2_state.data_to_send()
                if not data:
                    return
                try:
                    await self._network_stream.write(data)
                except Exception as exc:
                    self._write_exception = exc
                    self._connection_error = True


class HTTP2Pool:
    """HTTP/2 prior knowledge: streams share the newest connection until it is full."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_streams_per_connection: int = 100,
        connect_timeout: float = 10.0,
        stream_window: int = STREAM_WINDOW,
    ) -> None:
        self.upstream = upstream
        self.max_streams_per_connection = max_streams_per_connection
        self.connect_timeout = connect_timeout
        self.stream_window = stream_window
        self._backend = httpcore.AnyIOBackend()
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
        url = self.upstream.url(target)
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
                    stream = await self._backend.connect_tcp(
                        self.upstream.host, self.upstream.port, timeout=self.connect_timeout
                    )
                    self._current = Connection(
                        self.upstream.origin, stream, stream_window=self.stream_window
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
