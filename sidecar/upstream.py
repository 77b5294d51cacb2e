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

import httpcore

from sidecar.h1 import Headers, Response
from sidecar.h1pool import H1Pool
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
