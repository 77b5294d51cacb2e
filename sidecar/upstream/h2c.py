"""An `h2c://` upstream that does not speak HTTP/2: named, not a bare WriteError.

`h2c://` is HTTP/2 with prior knowledge: the connection opens with the HTTP/2 preface. Most
inference servers (vLLM, TGI, llama.cpp, anything behind uvicorn) speak HTTP/1.1 only. They
answer the preface with an HTTP/1.1 `400` and close, and httpcore then reports whichever
step failed (a write into the closed connection, or frames it cannot parse). `Watched` looks
at the first bytes a connection gets: an HTTP/1.x status line where the server's SETTINGS
frame belongs, or a close before any byte came, raises `NotH2C`, which says what to change.
It is an httpcore `RemoteProtocolError`, so every place that handles httpcore's errors (the
proxy's `map_exceptions`, `/readyz`) carries its message as it is.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import httpcore

logger = logging.getLogger("sidestream")

ANSWERED_HTTP1 = (
    "the upstream answered HTTP/1.1 to an HTTP/2 prior-knowledge request: use http:// "
    "(h2c:// is for servers that speak HTTP/2 without TLS, such as hypercorn or a gRPC server)"
)
CLOSED = (
    "the upstream closed the connection on the HTTP/2 prior-knowledge preface: it likely "
    "speaks HTTP/1.1 only, as most inference servers do: use http://"
)
LOOK_S = 1.0  # after a failed first write, how long the answer already sent may take to read


class NotH2C(httpcore.RemoteProtocolError):
    """The upstream does not speak HTTP/2 with prior knowledge."""


_told = False


def _refuse(message: str) -> NotH2C:
    global _told
    if not _told:  # once a process: every request to such an upstream fails the same way
        _told = True
        logger.error("upstream: %s", message)
    return NotH2C(message)


class Watched(httpcore.AsyncNetworkStream):
    """A connection whose first bytes are looked at once (see the module)."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._heard = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._stream.read(max_bytes, timeout)
        if not self._heard:
            self._heard = True
            if data.startswith(b"HTTP/1.") or data.startswith(b"HTTP/0."):
                raise _refuse(ANSWERED_HTTP1)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            await self._stream.write(buffer, timeout)
        except httpcore.WriteError:
            if self._heard:
                raise
            # Closed before a byte came back: the answer it sent first may still be there (a
            # reset on the unread preface discards it, then only the close is known).
            try:
                answer = await self._stream.read(64, LOOK_S)
            except (httpcore.ReadError, httpcore.ReadTimeout):
                answer = b""
            raise _refuse(ANSWERED_HTTP1 if answer.startswith(b"HTTP/") else CLOSED) from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._stream.start_tls(ssl_context, server_hostname, timeout)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class WatchingBackend(httpcore.AnyIOBackend):
    """httpcore's backend, each TCP connection `Watched`: for `h2c://` upstreams."""

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return Watched(await super().connect_tcp(*args, **kwargs))
