"""The pool per upstream scheme.

HTTP/1.1 (`http://`, `unix:`) runs on `sidecar.upstream.h1pool.H1Pool`, an asyncio
protocol on httptools; HTTP/2 prior knowledge (`h2c://`) runs on httpcore
(`sidecar.upstream.h2.HTTP2Pool`). `https://` runs on either, chosen by ALPN (`ALPNPool`).

Deliberately not httpcore's `AsyncConnectionPool`: its `_assign_requests_to_connections`
walks every connection for every request, quadratic in the number of open streams. The
HTTP/1.1 pool keeps idle connections in a LIFO deque (O(1) acquire and release); HTTP/2
multiplexes streams on the newest connection and opens another when that one is full.

An `Exchange` is an async context manager around one request, yielding a `Response`.
Leaving it normally returns the connection for reuse (when the response was fully read);
leaving it with an exception — cancellation included — closes the HTTP/1.1 connection at
once (a half-read connection is never reused) or ends the HTTP/2 stream (shielded).
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterable

import anyio
import httpcore

from sidecar.upstream.h1pool import H1Pool
from sidecar.upstream.h2 import HTTP2Pool, connect
from sidecar.upstream.tls import UpstreamTLS
from sidecar.upstream.types import Exchange, Headers, Pool, Response, Upstream


def make_pool(
    upstream: Upstream,
    *,
    connect_timeout: float = 10.0,
    max_idle: int = 256,
    tls: UpstreamTLS | None = None,
) -> Pool:
    """The connection manager for an upstream: HTTP/1.1 for http/unix, HTTP/2 for h2c, and
    whichever the upstream picks by ALPN for https."""
    if upstream.scheme == "https":
        return ALPNPool(upstream, tls or UpstreamTLS(), connect_timeout, max_idle)
    if upstream.scheme == "h2c":
        return HTTP2Pool(upstream, connect_timeout=connect_timeout)
    return _h1(upstream, connect_timeout, max_idle)


def _h1(
    upstream: Upstream, connect_timeout: float, max_idle: int, tls: UpstreamTLS | None = None
) -> H1Pool:
    return H1Pool(
        upstream.host,
        upstream.port,
        path=upstream.path,
        connect_timeout=connect_timeout,
        max_idle=max_idle,
        ssl_context=tls.context(["http/1.1"]) if tls is not None else None,
    )


class ALPNPool:
    """`https://`: the first connection offers h2 and http/1.1; the protocol the upstream
    picks decides the pool for the rest of the process (h2, with `RST_STREAM` cancellation,
    or the HTTP/1.1 pool over TLS).

    Deliberate: that first connection is only a question and is closed after the handshake,
    and each pool then offers only its own protocol — one extra handshake per process, in
    exchange for pools that never hold a connection of the other kind. Until an answer
    comes (the upstream down, or a TLS failure), every request asks again and fails with
    the connect error.
    """

    def __init__(
        self, upstream: Upstream, tls: UpstreamTLS, connect_timeout: float, max_idle: int
    ) -> None:
        self.upstream = upstream
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.chosen: Pool | None = None
        self._lock = anyio.Lock()
        self._probe_context = tls.context(["h2", "http/1.1"])  # a bad CA file fails here

    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> Exchange:
        if self.chosen is not None:
            return self.chosen.exchange(method, target, headers, body)
        return _FirstExchange(self, method, target, headers, body)

    async def choose(self) -> Pool:
        async with self._lock:
            if self.chosen is None:
                stream = await connect(
                    httpcore.AnyIOBackend(),
                    self.upstream,
                    self.connect_timeout,
                    self._probe_context,
                )
                ssl_object = stream.get_extra_info("ssl_object")
                alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                if alpn == "h2":
                    self.chosen = HTTP2Pool(
                        self.upstream,
                        connect_timeout=self.connect_timeout,
                        ssl_context=self.tls.context(["h2"]),
                    )
                else:
                    self.chosen = _h1(self.upstream, self.connect_timeout, self.max_idle, self.tls)
            return self.chosen

    async def aclose(self) -> None:
        if self.chosen is not None:
            await self.chosen.aclose()


class _FirstExchange:
    """An exchange made before ALPN's answer is known: asks, then runs on the chosen pool."""

    __slots__ = ("_args", "_inner", "_pool")

    def __init__(
        self,
        pool: ALPNPool,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None,
    ) -> None:
        self._pool = pool
        self._args = (method, target, headers, body)
        self._inner: Exchange | None = None

    async def __aenter__(self) -> Response:
        chosen = await self._pool.choose()
        self._inner = chosen.exchange(*self._args)
        return await self._inner.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        assert self._inner is not None
        await self._inner.__aexit__(exc_type, exc, tb)
