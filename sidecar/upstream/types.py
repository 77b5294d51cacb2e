"""What every upstream client shares: the origin (`Upstream`), headers, the `Response`, and
the `Pool` and `Exchange` interfaces the proxy talks to.

The clients (`sidecar.upstream.h1`/`h1pool` for HTTP/1.1, `sidecar.upstream.h2` for h2c and
h2) import this module and not each other; `sidecar.upstream.pools.make_pool` picks one.
"""

from __future__ import annotations

import types
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

Headers = list[tuple[bytes, bytes]]

Scheme = Literal["http", "https", "h2c", "unix"]

_SCHEMES: tuple[Scheme, ...] = ("http", "https", "h2c", "unix")
_NETWORK: dict[str, tuple[Scheme, int]] = {
    "http": ("http", 80),
    "https": ("https", 443),
    "h2c": ("h2c", 80),
}


class Response:
    """Status, headers (wire casing) and the body as an async iterator of chunks."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Headers, body: AsyncIterator[bytes]) -> None:
        self.status = status
        self.headers = headers
        self.body = body


@dataclass(frozen=True)
class Upstream:
    """Where the proxy sends every request: `http://host:port`, `https://host:port` (TLS, h2 or
    HTTP/1.1 by ALPN), `h2c://host:port`, `unix:/path`."""

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
        if parts.scheme not in _NETWORK:
            raise ValueError(
                f"upstream {url!r}: scheme must be one of " + ", ".join(f"{s}:" for s in _SCHEMES)
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"upstream {url!r}: must be an origin, without path or query")
        if parts.username or parts.password:
            raise ValueError(f"upstream {url!r}: must not carry credentials")
        scheme, default_port = _NETWORK[parts.scheme]
        try:
            port = parts.port or default_port
        except ValueError:
            raise ValueError(f"upstream {url!r}: the port is not a number in 1-65535") from None
        if not parts.hostname:
            raise ValueError(f"upstream {url!r}: the host is missing")
        return cls(scheme, parts.hostname, port)

    @property
    def authority(self) -> bytes:
        """The `Host` header the upstream gets."""
        if self.scheme == "unix":
            return b"localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}".encode("ascii")

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        return f"{self.scheme}://{self.authority.decode()}"


class Exchange(Protocol):
    """One request: entering sends it and yields the `Response` once its head is in."""

    async def __aenter__(self) -> Response: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None: ...


class Pool(Protocol):
    """The connections to the one upstream origin."""

    def exchange(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: AsyncIterable[bytes] | None = None,
    ) -> Exchange: ...

    async def aclose(self) -> None: ...
