"""One HTTP/1.1 upstream connection: an asyncio protocol on httptools' C parser (llhttp).

Built for the per-chunk hot path, where httpcore + anyio spend many Python calls per chunk:
a TCP read is parsed in C, body pieces land in a list through `list.append`, and a waiting
consumer is woken through one Future. `Response.body` takes everything received
so far as one chunk (one TCP read's body, never held back to coalesce more).

Flow control both ways, no unbounded buffer: body bytes that arrive while the consumer is
not waiting pause the transport (`pause_reading`) until it takes them, so at most one
chunk list sits here per connection; request writes wait on `pause_writing`.

Deliberate surprises:
- One parser per exchange: llhttp cannot be told that a response answers HEAD, so a HEAD
  response is complete at its headers and its parser is dropped with whatever state it had.
- A chunked body's parser is let go while it stands between chunks, and the connection stands
  in for it (`h1rest.ParserRest`): an open stream holds no parser between its tokens.
- No TCP_NODELAY set here (no token held back for the last one's ACK): uvloop's and asyncio's
  TCP transports set it, and asking for the socket would keep a socket object with every
  connection (uvloop keeps the one it made for the question).
- Errors are already `middleware.errors` classes: there is no foreign hierarchy to map.
"""

from __future__ import annotations

import asyncio
from typing import cast

from middleware.errors import UpstreamProtocolError
from middleware.types import SendNowait
from sidecar.headers import chunked, lower_names
from sidecar.servers.uvloop_internals import quiet_reads
from sidecar.speedups import H1Core
from sidecar.upstream.framing import request_line_problem
from sidecar.upstream.h1core import MAX_HEAD_BYTES
from sidecar.upstream.h1rest import ParserRest
from sidecar.upstream.types import Headers

_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing with this message."""


class H1Connection(H1Core, ParserRest, asyncio.Protocol):
    """A connection's protocol, and the state of the exchange running on it (if any); its
    per-read `data_received` is `H1Core`'s (`h1core.py`, or compiled: `sidecar.speedups`)."""

    __slots__ = (
        "_drain",
        "_framed",
        "_head_request",
        "_informational",
        "_loop",
        "_restful",
        "dead",
        "error",
        "head_done",
        "idle_since",
        "keep_alive",
        "lost",
        "on_body",
        "paused",
        "reader",
        "request_done",
        "status",
        "transport",
        "waiter",
        "write_paused",
    )

    def __init__(self) -> None:
        # Kept: asyncio.get_running_loop() costs a getpid() system call, once per token here.
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.dead = False  # closed, broken, or sent something unasked: never reuse
        self.lost = False  # connection_lost ran: no event will come any more
        self.idle_since = 0.0
        self.chunks = []
        self.on_body = None  # the parser's body callback (`ParserRest._parse`)
        self.waiter: asyncio.Future[None] | None = None  # head and state changes
        self.reader: asyncio.Future[bytes] | None = None  # the body's next chunk
        self.sink = None
        self.paused = False
        self.error: UpstreamProtocolError | None = None
        self._drain: asyncio.Future[None] | None = None
        self.write_paused = False
        self._parser = None
        self.begin(b"")

    def begin(self, method: bytes) -> None:
        """Reset the exchange state for a request with `method`."""
        self.status = 0
        self.headers = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False
        self.request_done = False
        self.error = None
        self.sink = None
        self.chunks.clear()
        self._head_request = method == b"HEAD"
        self._head_bytes = 0
        self._framed = False  # Content-Length or Transfer-Encoding seen
        self._informational = False
        self._restful = False  # its parser may rest between chunks (`_rest`)
        self.chunk_end = self.at_boundary = False
        self._parser = self._parse() if method else None
        if method and self.transport is not None:
            self.quiet()

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def _feed_failed(self, exc: Exception) -> None:
        cause = exc.__context__ if isinstance(exc.__context__, _Refused) else exc
        self._fail(f"invalid HTTP response from the upstream: {cause or type(exc).__name__}")

    def _after_feed(self) -> None:
        """A read is parsed and its body bytes (if any) were not all taken by the sink."""
        if self.at_boundary and self._restful:  # its parser rests (`h1rest`; again: no-op)
            self._rest()
        reader = self.reader
        if reader is not None:
            if reader.done():  # cancelled
                self.reader = None
            elif self.deliver(reader):
                self.reader = None
                return
            else:
                return  # nothing for it yet (this read held chunk framing only): it waits
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self.chunks and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost decides what the EOF meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = self.lost = True
        if self._parser is not None and not self.complete:
            if self.head_done and not self._framed and exc is None and self.error is None:
                self.complete = True  # read-until-close framing: EOF ends the body
            elif self.head_done:
                self._fail("the upstream closed the connection in the middle of the body")
            else:
                self._fail("the upstream closed the connection without a response")
        self._wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # --- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second response nobody asked for: stop before its body
            raise _Refused("a second response to one request")

    def _refuse_head(self) -> None:  # from `on_header` (H1Core's)
        raise _Refused(f"response headers exceed {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        parser = self._parser
        if parser is self:  # type: ignore[comparison-overlap]  # `feed_data`'s new parser: not news
            return
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: wait for the real one
            self._informational = True
            self.headers = []
            self._head_bytes = 0
            return
        self.status = status
        self.head_done = True
        # Content-Length or Transfer-Encoding: told here, once, not in each `on_header`.
        names = lower_names(self.headers)
        self._framed = not _FRAMING.isdisjoint(names)
        # A chunked body begins right after the head: the parser stands between chunks.
        self.chunk_end = self._framed and chunked(self.headers, names)
        if self._head_request:
            self.complete = True
            self.keep_alive = parser.should_keep_alive()
        elif self.chunk_end:  # HTTP/1.1 kept alive: what `h1rest.RESUMED_HEAD` says
            self._restful = parser.should_keep_alive() and parser.get_http_version() == "1.1"

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        if not self.complete:
            assert self._parser is not None
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()

    # --- used by the exchange -----------------------------------------------------------

    def wait(self) -> asyncio.Future[None]:
        """A Future resolved at the next state change (data, EOF, error)."""
        assert self.transport is not None
        if self.lost:
            raise self.error or UpstreamProtocolError("the upstream connection is closed")
        waiter: asyncio.Future[None] = self._loop.create_future()
        self.waiter = waiter
        if self.paused:
            self._resume()
        return waiter

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        while self.write_paused and not self.dead:
            self._drain = self._loop.create_future()
            await self._drain

    def quiet(self) -> None:
        """Each read (a token, mostly) in fewer steps where uvloop allows it
        (`uvloop_internals.quiet_reads`): asked at each request and again after each
        `resume_reading`, which puts uvloop's own callbacks back."""
        assert self.transport is not None
        quiet_reads(self.transport, self._loop, self)

    def _resume(self) -> None:
        self.paused = False
        assert self.transport is not None
        self.transport.resume_reading()
        self.quiet()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        """Close now (RST when unread data is pending); the connection is never reused."""
        self.dead = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        done = self.complete and self.request_done and not self.chunks
        return done and self.keep_alive and not self.dead

    def finish(self, now: float) -> None:
        """The exchange is over and the connection goes idle."""
        self.begin(b"")
        self.idle_since = now

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = UpstreamProtocolError(message)
        self.abort()
        self._wake()

    def _wake(self) -> None:
        for future in (self.waiter, self._drain):
            if future is not None and not future.done():
                future.set_result(None)
        self.waiter = self._drain = None
        reader, self.reader = self.reader, None
        if reader is not None and not reader.done():
            self.deliver(reader)

    def deliver(self, future: asyncio.Future[bytes]) -> bool:
        """Settle `future` with the next body chunk (every byte received so far), the end
        (StopAsyncIteration) or the error; False when there is nothing to say yet."""
        chunks = self.chunks
        if chunks:
            data = b"".join(chunks)  # one piece: returned as is, no copy
            chunks.clear()
            if self.paused:
                self._resume()
            future.set_result(data)
        elif self.complete:
            future.set_exception(StopAsyncIteration())
        elif self.error is not None:
            future.set_exception(self.error)
        elif self.lost:
            future.set_exception(UpstreamProtocolError("the upstream connection is closed"))
        else:
            return False
        return True


class Body:
    """`Response.body` for HTTP/1.1: each call takes every body byte received so far."""

    __slots__ = ("_conn",)

    def __init__(self, conn: H1Connection) -> None:
        self._conn = conn

    def __aiter__(self) -> Body:
        return self

    def push_to(self, sink: SendNowait) -> None:
        """Offer every later read's body bytes to `sink` first, from the protocol callback:
        what it takes never comes out of this iterator; what it refuses does, as usual."""
        self._conn.sink = sink

    def stop(self) -> None:
        """Close the connection now, before the consumer leaves the exchange (the guard's
        `stop`): what it reads next is an error, and the connection is never reused."""
        self._conn.abort()

    def __anext__(self) -> asyncio.Future[bytes]:
        # A Future, not a coroutine: the connection settles it with the chunk itself, so a
        # token costs no coroutine frame here and no second look at the connection.
        conn = self._conn
        future = conn._loop.create_future()
        if not conn.deliver(future):
            conn.reader = future
        return future


def encode_head(method: bytes, target: bytes, headers: Headers) -> bytes:
    """The request line and headers; refuses a method that is not a token, a target with
    SP or a control byte, and CR or LF inside a header (no smuggling). The proxy answers
    400 to such a request before it gets here; this is the line no path can skip."""
    problem = request_line_problem(method, target)
    if problem is not None:
        raise UpstreamProtocolError(f"refusing a request line: {problem}")
    # `b": ".join` of each (name, value) pair: the header lines without a Python call each.
    lines = b"\r\n".join(map(b": ".join, headers))
    head = b"%b %b HTTP/1.1\r\n%b\r\n\r\n" % (method, target, lines)
    if not headers:
        head = head[:-2]  # no header lines: the request line's end, then the blank line
    ends = len(headers) + 2  # the request line's, each header's, the blank line's
    if head.count(b"\n") != ends or head.count(b"\r") != ends:
        raise UpstreamProtocolError("refusing a request with CR or LF inside a header")
    return head
