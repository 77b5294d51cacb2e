"""The reverse proxy: a pure ASGI app relaying every HTTP request to one fixed upstream.

`ProxyApp` holds configuration and the connection pool only; each request's state lives in
locals and a per-request `RequestBody`. The relay is pull-based — read one upstream chunk,
`await send()` it, repeat — so a slow client stops upstream reads, and nothing is queued.

When the server offers the `SEND_NOWAIT` extension (the sidecar's HTTP/1.1 listener, through
StreamGuard), an HTTP/1.1 upstream read is written to the client from the upstream
protocol's callback, without waking this request's task.
Whatever it refuses (a slow client, a keep-alive being written, the guard's own cases)
comes out of the body iterator and takes the `send` path above, in order. The proxy also
puts its HTTP/1.1 connection's close there as the extension's `stop`: when the guard stops
the stream, the upstream sees the close in that loop turn, before the cancellation reaches
this task (which then leaves the exchange as usual).

Deliberate surprises (do not "fix"):
- Upstream failures are raised, not answered: the HTTP/1.1 pool raises `middleware.errors`
  classes itself, httpcore's (h2c) are translated into them at this boundary, and
  StreamGuard turns them into a 502/504 (before headers) or a terminal SSE event (after).
  `error_response()` is the before-headers half, for the guard and for tests running the
  app without it.
- Requests the proxy refuses itself (400, 405, 413, 431) are answered here, without contacting
  the upstream: they are the client's errors, not stream failures.
- A client that disconnects while sending its body ends the request quietly: there is no
  one left to answer.
"""

from __future__ import annotations

import json
import types
import urllib.parse

import httpcore

from middleware.errors import StreamError, UpstreamConnectError, UpstreamProtocolError
from middleware.types import SEND_NOWAIT, Message, Receive, Scope, Send
from sidecar import headers as rules
from sidecar.tracecontext import inject_trace_context
from sidecar.upstream.errors import UpstreamTimeout
from sidecar.upstream.framing import request_line_problem
from sidecar.upstream.h1 import Body as H1Body
from sidecar.upstream.pools import make_pool
from sidecar.upstream.tls import UpstreamTLS
from sidecar.upstream.types import Exchange, Pool, Upstream

MiB = 1024 * 1024

_REFUSED_METHODS = frozenset({"CONNECT", "TRACE"})
_CLOSE = [(b"connection", b"close")]  # body unread or its framing in doubt: do not reuse


class BodyTooLarge(Exception):
    """The request body passed `max_body` while streaming it upstream."""


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


class MapExceptions:
    """`with map_exceptions:` translates httpcore's exceptions (the h2c pool) into the
    `middleware.errors` hierarchy. One stateless object, not a generator context manager:
    a stream would hold the generator and its frame for as long as it is open. Its methods
    are static: `with` then takes the function itself, where a method would be bound anew
    for each `with` and held on the stack of every open stream's frame."""

    __slots__ = ()

    @staticmethod
    def __enter__() -> None:
        return None

    @staticmethod
    def __exit__(
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, httpcore.ConnectTimeout):
            raise UpstreamTimeout(f"timed out connecting to the upstream: {exc}") from exc
        if isinstance(exc, httpcore.ConnectError):
            raise UpstreamConnectError(f"could not connect to the upstream: {exc}") from exc
        if isinstance(
            exc,
            httpcore.ProtocolError
            | httpcore.NetworkError
            | httpcore.TimeoutException
            | httpcore.ConnectionNotAvailable,
        ):
            detail = str(exc) or type(exc).__name__
            raise UpstreamProtocolError(f"the upstream broke the HTTP exchange: {detail}") from exc


map_exceptions = MapExceptions()


class RequestBody:
    """The client's body as an async iterator over `receive()`: streamed, never buffered.

    Counts bytes against `limit`; `started` (a byte was taken) tells the pool whether
    sending the request again on a fresh connection is still safe.
    """

    __slots__ = ("_first", "_limit", "_more", "_receive", "received", "started")

    def __init__(self, receive: Receive, limit: int | None, first: Message | None = None) -> None:
        self._receive = receive
        self._limit = limit
        self._first = first
        self._more = True
        self.received = 0
        self.started = False

    def __aiter__(self) -> RequestBody:
        return self

    async def __anext__(self) -> bytes:
        while self._more:
            if self._first is not None:
                message, self._first = self._first, None
            else:
                message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            self._more = message.get("more_body", False)
            chunk: bytes = message.get("body", b"")
            if chunk:
                self.started = True
                self.received += len(chunk)
                if self._limit is not None and self.received > self._limit:
                    raise BodyTooLarge()
                return chunk
        raise StopAsyncIteration


async def error_response(exc: StreamError, send: Send) -> None:
    """Answer with `exc`'s status and JSON error body (only before response headers)."""
    await _json_response(send, exc.status, exc.json_body())


async def _json_response(
    send: Send, status: int, body: bytes, extra: rules.Headers | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(extra or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _refuse(
    send: Send, status: int, code: str, message: str, extra: rules.Headers | None = None
) -> None:
    error = {"message": message, "type": "invalid_request_error", "code": code}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    await _json_response(send, status, body, extra)


class ProxyApp:
    """ASGI app forwarding HTTP requests to `upstream`; lifespan opens and closes the pool."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        max_body: int | None = 100 * MiB,
        max_header_bytes: int = 32768,
        connect_timeout: float = 10.0,
        max_idle_connections: int = 256,
        tls: UpstreamTLS | None = None,
    ) -> None:
        self.upstream = upstream
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.pool: Pool = make_pool(
            upstream, connect_timeout=connect_timeout, max_idle=max_idle_connections, tls=tls
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        # The relay is written out here, not in a method: a stream is resumed once per token
        # through every coroutine level above the upstream read. What only the request's
        # start needs (the upstream's headers, the body iterator) lives in `_exchange`'s frame
        # and is gone once the exchange is made, not held while the stream is open.
        exchange = await self._exchange(scope, receive, send)
        if exchange is None:
            return  # refused and answered here
        offer = scope.get("extensions", {}).get(SEND_NOWAIT)
        try:
            with map_exceptions:
                async with exchange as response:
                    body = response.body
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": rules.response_headers(response.headers),
                        }
                    )
                    del response  # its headers are sent: not held while the stream is open
                    if offer is not None and isinstance(body, H1Body):
                        offer["stop"] = body.stop  # closed the moment the guard stops
                        body.push_to(offer["send"])
                    async for chunk in body:
                        if chunk:
                            await send(
                                {"type": "http.response.body", "body": chunk, "more_body": True}
                            )
                        del chunk  # nor the last chunk while the stream idles
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                if offer is not None:
                    offer.pop("stop", None)  # the connection may serve another request now
        except BodyTooLarge:
            await _refuse(send, 413, "request_too_large", self._too_large(), _CLOSE)
        except ClientDisconnected:
            return

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> Exchange | None:
        """The upstream exchange for this request, or None when the proxy refused it itself
        (405, 431, 400, 413: answered here, the upstream never contacted)."""
        method: str = scope["method"]
        if method in _REFUSED_METHODS:
            allow = [(b"allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")]
            await _refuse(send, 405, "method_not_allowed", f"{method} is not proxied", allow)
            return None
        client = scope.get("client")
        size, problem, declared, chunked, upstream_headers = rules.request_rules(
            scope["headers"],
            scope.get("http_version", "1.1"),
            self.upstream.authority,
            client[0] if client else None,
            scope.get("scheme", "http"),
        )
        if size > self.max_header_bytes:
            message = f"request headers exceed {self.max_header_bytes} bytes"
            await _refuse(send, 431, "request_header_fields_too_large", message, _CLOSE)
            return None
        if problem is not None:
            await _refuse(send, 400, "bad_request", f"refused: {problem}", _CLOSE)
            return None
        # A method or target an HTTP/1.1 request line cannot hold (an HTTP/2 client's
        # `:method` or `:path` may) would split that line upstream.
        raw_method, target = method.encode("latin-1", "replace"), _target(scope)
        problem = request_line_problem(raw_method, target)
        if problem is not None:
            await _refuse(send, 400, "bad_request", f"refused: {problem}", _CLOSE)
            return None
        if self.max_body is not None and declared is not None and declared > self.max_body:
            await _refuse(send, 413, "request_too_large", self._too_large(), _CLOSE)
            return None
        inject_trace_context(upstream_headers)
        body = await self._body(chunked, declared, receive, upstream_headers)
        with map_exceptions:
            return self.pool.exchange(raw_method, target, upstream_headers, body)

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1003})

    async def aclose(self) -> None:
        """Close every pooled upstream connection."""
        await self.pool.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _too_large(self) -> str:
        return f"request body exceeds {self.max_body} bytes"

    async def _body(
        self,
        chunked: bool,
        declared: int | None,
        receive: Receive,
        upstream_headers: rules.Headers,
    ) -> RequestBody:
        """The body iterator, and the one framing header upstream: the declared length as
        a plain number, or `transfer-encoding: chunked` when the length is unknown (client
        sent chunked, or an HTTP/2 client sent a body without a length)."""
        if chunked:
            upstream_headers.append((b"transfer-encoding", b"chunked"))
            return RequestBody(receive, self.max_body)
        if declared is not None:
            upstream_headers.append((b"content-length", b"%d" % declared))
            return RequestBody(receive, self.max_body)
        # No framing header: peek, so a body-less request stays body-less upstream.
        first = await receive()
        if first["type"] == "http.request" and (first.get("body") or first.get("more_body")):
            upstream_headers.append((b"transfer-encoding", b"chunked"))
        return RequestBody(receive, self.max_body, first)


def _target(scope: Scope) -> bytes:
    raw_path: bytes | None = scope.get("raw_path")
    if raw_path is None:
        raw_path = urllib.parse.quote(scope["path"]).encode("ascii")
    target = rules.origin_form(raw_path)
    query: bytes = scope.get("query_string", b"")
    return target + b"?" + query if query else target
