"""Test upstreams for the proxy: an echo ASGI app, a raw asyncio server, a unix-socket server.

`EchoUpstream` answers every path by echoing what it received as JSON, except a few
endpoints: `/bytes?size=N` (fixed body with Content-Length), `/status/NNN`, `/stream?n=N`
(SSE), `/gated` (one SSE event each time the test puts on `gate`, ends on None) and
`/hold` (one event, then sets `disconnected` when the client goes away).
`RawUpstream` is a plain asyncio server with a test-supplied handler, for what a
well-behaved server cannot do: stay silent, die mid-body, send hop-by-hop headers, and
record when its socket sees EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from middleware.errors import StreamError
from middleware.types import ASGIApp, Message, Receive, Scope, Send
from sidecar.proxy import error_response
from tests.support.servers import _QuietUvicorn


class EchoUpstream:
    """An ASGI upstream that records every request it sees."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.first_body = asyncio.Event()
        self.gate: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.disconnected = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        query = urllib.parse.parse_qs(scope["query_string"].decode())
        if path == "/bytes":
            size = int(query["size"][0])
            body = bytes(i % 251 for i in range(size))
            await _respond(send, 200, body, [(b"content-type", b"application/octet-stream")])
            return
        if path.startswith("/status/"):
            body = json.dumps({"status": int(path[8:])}).encode()
            await _respond(send, int(path[8:]), body, [(b"x-upstream", b"yes")])
            return
        if path == "/hold":  # one event, then wait for the client to go away
            self.seen.append({"path": path, "client": scope["client"]})
            await _sse(send, 0, None, end=False)
            await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        if path in ("/stream", "/gated"):
            self.seen.append({"path": path, "client": scope["client"]})
            await _sse(send, int(query.get("n", ["3"])[0]), self.gate if path == "/gated" else None)
            return
        record = await self._record(scope, receive)
        await _respond(
            send, 200, json.dumps(record).encode(), [(b"content-type", b"application/json")]
        )

    async def _record(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        digest = hashlib.sha256()
        parts: list[bytes] = []
        length = 0
        more = True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            if chunk:
                self.first_body.set()
                digest.update(chunk)
                length += len(chunk)
                if length <= 65536:
                    parts.append(chunk)
            more = message.get("more_body", False)
        record = {
            "method": scope["method"],
            "raw_path": scope["raw_path"].decode("latin-1"),
            "query_string": scope["query_string"].decode("latin-1"),
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
            "http_version": scope["http_version"],
            "client": list(scope["client"] or ()),
            "body": b"".join(parts).decode("latin-1") if length <= 65536 else None,
            "body_length": length,
            "body_sha256": digest.hexdigest(),
        }
        self.seen.append(record)
        return record


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _sse(
    send: Send, n: int, gate: asyncio.Queue[bytes | None] | None, *, end: bool = True
) -> None:
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    i = 0
    while gate is not None or i < n:
        if gate is not None:
            event = await gate.get()
            if event is None:
                break
        else:
            event = f"data: {i}\n\n".encode()
        await send({"type": "http.response.body", "body": event, "more_body": True})
        i += 1
    if end:
        await send({"type": "http.response.body", "body": b""})


def header(record: dict[str, Any], name: str) -> list[str]:
    """All values of `name` among the headers an `EchoUpstream` record saw."""
    return [v for k, v in record["headers"] if k == name]


Handler = Callable[["RawConnection"], Awaitable[None]]


@dataclass
class RawConnection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    eof_at: float | None = None
    eof: asyncio.Event = field(default_factory=asyncio.Event)

    async def read_head(self) -> bytes:
        """One request head (up to the blank line); b'' when the peer closed first."""
        try:
            return await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.eof_at = time.monotonic()
            self.eof.set()
            return b""

    async def wait_eof(self) -> None:
        """Read until EOF (or reset) and record when it came."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        self.eof_at = time.monotonic()
        self.eof.set()


@dataclass
class RawUpstream:
    """A raw asyncio server; `handler` runs once per accepted connection."""

    handler: Handler
    connections: list[RawConnection] = field(default_factory=list)
    accepted: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = RawConnection(reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections.append(connection)
        self.accepted.set()
        try:
            await self.handler(connection)
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawUpstream]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for connection in self.connections:
                connection.writer.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()


@contextlib.asynccontextmanager
async def serve_unix(app: ASGIApp, path: str) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a unix socket at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=1)
    server = _QuietUvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield path
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ErrorResponder:
    """Stand-in for StreamGuard's error half: a StreamError before headers becomes its JSON
    response; after headers the response is ended. Every error is kept in `errors`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.errors: list[StreamError] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except StreamError as exc:
            self.errors.append(exc)
            if not started:
                await error_response(exc, send)
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
