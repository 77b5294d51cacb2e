"""A raw HTTP/1.1 client on asyncio streams: it sees every byte and every pause.

It parses just enough HTTP (status line, headers, chunked framing) to hand a test the
body chunks as they arrive, with their arrival times.

A writer left open is a ResourceWarning when it is collected, which the suite's
`filterwarnings = ["error"]` turns into a failure of whichever test is running then:
`connection()` and `request()` close theirs however the caller's code ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[str, str]]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    chunked: bool
    length: int | None
    arrivals: list[tuple[float, bytes]] = field(default_factory=list)
    _left: int | None = None
    done: bool = False

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    async def chunk(self) -> bytes | None:
        """The next body chunk as framed by the server, or None at a clean end."""
        if self.done:
            return None
        if self.chunked:
            size_line = await self.reader.readline()
            if not size_line:
                raise ConnectionError("connection closed inside chunked body")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await self.reader.readline()
                self.done = True
                return None
            data = await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        else:
            if self._left is None:
                self._left = self.length
            if self._left == 0:
                self.done = True
                return None
            data = await self.reader.read(65536 if self._left is None else min(self._left, 65536))
            if not data:
                if self._left is None:
                    self.done = True
                    return None
                raise ConnectionError("connection closed before Content-Length was reached")
            if self._left is not None:
                self._left -= len(data)
        self.arrivals.append((time.monotonic(), data))
        return data

    async def body(self) -> bytes:
        parts = []
        while (data := await self.chunk()) is not None:
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        self.writer.close()

    def reset(self) -> None:
        """Close with RST instead of FIN (SO_LINGER 0)."""
        import socket
        import struct

        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()


async def request(
    port: int,
    method: str = "GET",
    path: str = "/",
    *,
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    host: str = "127.0.0.1",
) -> RawResponse:
    """Send one request; the response once its head is in (the caller closes it). Should
    the request or the head fail (or the wait be cancelled), the connection is closed here."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    sent = {k.lower() for k, _ in headers or []}
    for key, value in headers or []:
        lines.append(f"{key}: {value}")
    if body and "content-length" not in sent and "transfer-encoding" not in sent:
        lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_response(reader, writer)
    except BaseException:
        writer.close()
        raise


@contextlib.asynccontextmanager
async def connection(
    port: int, host: str = "127.0.0.1", **options: Any
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`asyncio.open_connection(host, port, **options)`; the writer is closed (and its close
    awaited, up to a second) however the block ends: assertion, timeout or cancel."""
    reader, writer = await asyncio.open_connection(host, port, **options)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(Exception):  # reset or refused by then: closed all the same
            await asyncio.wait_for(writer.wait_closed(), 1)


async def read_response(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RawResponse:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ")[1])
    headers = []
    for line in header_lines:
        if line:
            key, _, value = line.partition(":")
            headers.append((key.strip(), value.strip()))
    names = {k.lower(): v for k, v in headers}
    chunked = names.get("transfer-encoding", "").lower() == "chunked"
    length = int(names["content-length"]) if "content-length" in names else None
    return RawResponse(status, headers, reader, writer, chunked, length)
