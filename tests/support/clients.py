"""A raw HTTP/1.1 client on asyncio streams: it sees every byte and every pause.

It parses just enough HTTP (status line, headers, chunked framing) to hand a test the
body chunks as they arrive, with their arrival times.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


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
    reader, writer = await asyncio.open_connection(host, port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    sent = {k.lower() for k, _ in headers or []}
    for key, value in headers or []:
        lines.append(f"{key}: {value}")
    if body and "content-length" not in sent and "transfer-encoding" not in sent:
        lines.append(f"Content-Length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()
    return await read_response(reader, writer)


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
