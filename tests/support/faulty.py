"""Raw asyncio upstreams that break HTTP on purpose, for the fault suite and the soak.

`FaultyUpstream` is a tiny HTTP/1.1 server on 127.0.0.1 speaking just enough HTTP to
stand in for an OpenAI-compatible streamer. Each request picks its behaviour with the
`X-Fault` header (the sidecar forwards it), else the server's default. Pacing for the
healthy stream: `X-Fault-Tokens`, `X-Fault-TTFT-Ms`, `X-Fault-ITL-Ms`.

It counts what a leak test needs: `open` sockets, `busy` connections (a request head read and
its answer not finished) and `cancelled` answers (the client — the sidecar — left mid-answer,
seen while waiting as well as while writing). `record_outcomes()` records the outcome of every
`middleware.cycle.Cycle` that finishes, until telemetry's log line can be read instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from middleware.cycle import Cycle
from middleware.errors import Outcome

FAULTS = (
    "ok",  # a healthy chat stream ending with [DONE]
    "fin",  # two tokens, then FIN without [DONE] or the last chunk
    "rst",  # two tokens, then RST
    "truncated",  # a chunk header promising 100 bytes, 10 bytes, then FIN
    "invalid",  # a garbage status line: not HTTP at all
    "silent",  # reads the request and never answers
    "headers_only",  # SSE response headers, then nothing, ever
    "huge_line",  # one 10 MB `data:` line without a newline, then a token and [DONE]
    "bad_utf8",  # events whose bytes are not UTF-8 (BAD_UTF8_BODY), then [DONE]
    "500",  # a JSON error with status 500
    "429",  # a JSON error with status 429 and Retry-After
)

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
)
DONE = b"data: [DONE]\n\n"
HUGE_LINE_BYTES = 10 * 1024 * 1024
BAD_UTF8_BODY = (
    b'data: {"choices":[{"index":0,"delta":{"content":"caf\xe9 \xff\xfe"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"\xe2\x82"}}]}\n\n' + DONE
)
ERROR_BODIES = {
    "500": b'{"error":{"message":"the model crashed","type":"server_error","code":"internal"}}',
    "429": b'{"error":{"message":"slow down","type":"rate_limit","code":"rate_limited"}}',
}


def token(text: str) -> bytes:
    delta = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
    return b"data: " + delta.encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Gone(Exception):
    """The peer closed its side while the upstream was waiting or writing."""


class FaultyUpstream:
    """`async with FaultyUpstream("fin") as up:` serves on `up.port` until the block ends."""

    def __init__(self, fault: str = "ok", port: int = 0) -> None:
        assert fault in FAULTS, fault
        self.fault = fault
        self.port = port
        self.open = 0
        self.busy = 0
        self.requests = 0
        self.cancelled = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> FaultyUpstream:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True, backlog=1024
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections))
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.open += 1
        reset = False
        try:
            while True:
                headers = await read_head(reader)
                if headers is None:
                    return
                self.requests += 1
                self.busy += 1
                try:
                    await read_body(reader, headers)
                    keep, reset = await self._answer(headers, reader, writer)
                except Gone:
                    self.cancelled += 1
                    return
                finally:
                    self.busy -= 1
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            self.open -= 1
            self._connections.discard(task)
            if reset:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()

    async def _answer(
        self, headers: dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[bool, bool]:
        """Answer one request; (keep the connection, close it with RST)."""
        fault = headers.get("x-fault", self.fault)
        gone = asyncio.ensure_future(reader.read(1))  # b"" (or an error) once the peer closes
        try:
            return await self._fault(fault, headers, writer, gone)
        finally:
            gone.cancel()
            with contextlib.suppress(BaseException):
                await gone

    async def _fault(
        self,
        fault: str,
        headers: dict[str, str],
        writer: asyncio.StreamWriter,
        gone: asyncio.Future[bytes],
    ) -> tuple[bool, bool]:
        async def wait(seconds: float | None) -> None:
            done, _ = await asyncio.wait((gone,), timeout=seconds)
            if done:
                raise Gone

        async def write(data: bytes) -> None:
            if gone.done():
                raise Gone
            writer.write(data)
            try:
                await writer.drain()
            except ConnectionError:
                raise Gone from None

        if fault in ERROR_BODIES:
            body = ERROR_BODIES[fault]
            extra = b"retry-after: 7\r\n" if fault == "429" else b""
            status = b"500 Internal Server Error" if fault == "500" else b"429 Too Many Requests"
            head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n" % status
            await write(head + extra + b"content-length: %d\r\n\r\n" % len(body) + body)
            return True, False
        if fault == "invalid":
            await write(b"HTXP/9.9 banana split\r\nno colon here\r\n\r\n")
            await wait(None)
        if fault == "silent":
            await wait(None)
        await write(SSE_HEAD)
        if fault == "headers_only":
            await wait(None)
        if fault in ("fin", "rst", "truncated"):
            await write(chunk(token("one ")) + chunk(token("two ")))
            await wait(0.05)
            if fault == "truncated":
                await write(b"64\r\n" + b"0123456789")
            return False, fault == "rst"
        if fault == "huge_line":
            piece = b"x" * 65536
            await write(chunk(b"data: "))
            for _ in range(HUGE_LINE_BYTES // len(piece)):
                await write(chunk(piece))
            await write(chunk(b"\n\n" + token("after") + DONE) + b"0\r\n\r\n")
            return True, False
        if fault == "bad_utf8":
            await write(chunk(BAD_UTF8_BODY) + b"0\r\n\r\n")
            return True, False
        tokens = int(headers.get("x-fault-tokens", "20"))
        await wait(int(headers.get("x-fault-ttft-ms", "0")) / 1000)
        itl = int(headers.get("x-fault-itl-ms", "10")) / 1000
        for n in range(tokens):
            await write(chunk(token(f"t{n} ")))
            await wait(itl)
        await write(chunk(DONE) + b"0\r\n\r\n")
        return True, False


async def read_head(reader: asyncio.StreamReader) -> dict[str, str] | None:
    """Read one request head; lower-cased headers, or None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
    """Read (and drop) the request body framed by Content-Length or chunked encoding."""
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break


@contextlib.contextmanager
def record_outcomes() -> Iterator[list[Outcome]]:
    """Patch `Cycle.run` to append each request's outcome once it has run."""
    outcomes: list[Outcome] = []
    original = Cycle.run

    async def run(self: Cycle) -> None:
        try:
            await original(self)
        finally:
            outcomes.append(self.outcome)

    Cycle.run = run  # type: ignore[method-assign]
    try:
        yield outcomes
    finally:
        Cycle.run = original  # type: ignore[method-assign]
