"""An HTTP/1.1 upstream that accepts anything and records every byte, to see smuggling.

`ByteRecorder` is a raw asyncio server. It keeps each connection's bytes as they came and
answers like a lenient keep-alive server: it reads requests by their `Content-Length` alone
(no chunked decoding, no refusal) and answers each with a small 200, so a request smuggled
into a body gets its own answer on the pooled connection, as it would from a real server
that trusts Content-Length. What the proxy sent is then judged apart from how it was answered:
`strict_requests` parses a connection's bytes with h11, the strict parser, and raises on
anything h11 refuses, so a test can say "exactly one well-framed request per client request".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11

_ANSWER = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
)


@dataclass
class Received:
    """One request as h11 read it: the head's headers as sent, and the body's bytes."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def count(self, name: bytes) -> int:
        return sum(1 for n, _ in self.headers if n.lower() == name)


def strict_requests(data: bytes) -> list[Received]:
    """Every request in one connection's bytes, read by h11; raises h11's error on any
    framing it refuses (both CL and TE, a bad length, a bad request line) and AssertionError
    on bytes left over that do not make a whole request."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 24)
    conn.receive_data(data)
    conn.receive_data(b"")  # the peer's close: a request cut short is an error, not a wait
    requests: list[Received] = []
    current: Received | None = None
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            raw = [(bytes(n), bytes(v)) for n, v in event.headers.raw_items()]
            current = Received(bytes(event.method), bytes(event.target), raw, b"")
        elif isinstance(event, h11.Data):
            assert current is not None
            current.body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert current is not None
            requests.append(current)
            current = None
            conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
        else:  # NEED_DATA, ConnectionClosed: every whole request is read
            break
    assert current is None, f"a request cut short: {current}"
    return requests


@dataclass
class ByteRecorder:
    """The raw server; `streams` holds each accepted connection's bytes, in order."""

    streams: list[bytearray] = field(default_factory=list)
    answered: int = 0
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = bytearray()
        self.streams.append(received)
        pending = b""
        try:
            while data := await reader.read(65536):
                received += data
                pending += data
                pending = self._answer(pending, writer)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, pending: bytes, writer: asyncio.StreamWriter) -> bytes:
        """Answer every whole request in `pending` (Content-Length framing only); the rest."""
        while (end := pending.find(b"\r\n\r\n")) >= 0:
            head, rest = pending[:end], pending[end + 4 :]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and value.strip().isdigit():
                    length = int(value.strip()[:18])  # lenient, and bounded
            if len(rest) < length:
                break
            pending = rest[length:]
            self.answered += 1
            writer.write(_ANSWER)
        return pending

    def requests(self) -> list[Received]:
        """Every request of every connection, strictly parsed, in connection order."""
        return [request for data in self.streams for request in strict_requests(bytes(data))]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ByteRecorder]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            async with server:
                yield self
        finally:
            server.close()
