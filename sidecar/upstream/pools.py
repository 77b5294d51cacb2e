"""The pool per upstream scheme.

HTTP/1.1 (`http://`, `unix:`) runs on `sidecar.upstream.h1pool.H1Pool`, an asyncio
protocol on httptools; HTTP/2 prior knowledge (`h2c://`) runs on httpcore
(`sidecar.upstream.h2.HTTP2Pool`).

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

from sidecar.upstream.h1pool import H1Pool
from sidecar.upstream.h2 import HTTP2Pool
from sidecar.upstream.types import Pool, Upstream


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
