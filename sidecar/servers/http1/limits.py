"""The traffic protocol's request-head limits (`HeadLimits`), and the answers it writes
when one is crossed.

The traffic protocol has what nginx calls `client_header_timeout` and
`large_client_header_buffers`. uvicorn's own protocol reads a request head for as long as
the client cares to trickle it, and lets the head grow without bound before the app sees
it: one slowloris client per file descriptor holds the sidecar open forever. So:

- a request head (request line and headers) must be complete within `header_timeout`
  seconds of the connection opening, or of its first byte on a kept-alive connection
  (between requests the keep-alive timeout, uvicorn's `timeout_keep_alive`, applies);
  past it: 408 and close (a connection that sent nothing is just closed);
- a head larger than `max_head_bytes` is answered 431 and closed; a head is held in memory
  up to that cap plus one read;
- `CONNECT` (authority-form target, which has no path to parse) gets 405, like `TRACE` does
  in the proxy, instead of the 400 uvicorn's own protocol gives it.

Deliberate: the deadline is set per connection and per request head, never per read; reads
only add to a byte count. The answers are written straight to the transport: no ASGI
request exists yet. The deadlines of a listener's connections share one loop timer
(`HeadDeadlines`): each new connection sets one on its way to its stream's first token,
where a loop timer of its own (uvloop: a handle and a libuv timer made, started, stopped and
closed) cost more than the dict entry.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Protocol

_REASONS = {
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
}


def answer(status: int, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole response, the JSON error body the proxy's own refusals carry; it closes."""
    error = {"message": message, "type": "invalid_request_error", "code": code}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n%s" % (status, _REASONS[status], len(body), extra, body)
    )


def bad_request(message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The 400 for a request the parser refused, as uvicorn's protocols write it; it closes."""
    head = b"".join(b"%b: %b\r\n" % pair for pair in default_headers)
    return (
        b"HTTP/1.1 400 Bad Request\r\n%bcontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%b"
        % (head, len(message), message.encode("ascii"))
    )


class HeadWaiter(Protocol):
    def _head_timed_out(self) -> None: ...


class HeadDeadlines:
    """The request-head deadlines of one listener's connections on one loop, all `timeout`
    seconds long: kept in the order they were set, which is the order they fall due, under
    one loop timer set for the first. Setting one is a dict insert, clearing it a dict pop;
    a cleared deadline leaves the loop timer as it is, which when it fires finds the next one
    due and is set for it (or for none). `due` says what a deadline that falls means
    (`BodyDeadlines`: the same for request bodies)."""

    __slots__ = ("loop", "pending", "timeout", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.pending: dict[HeadWaiter, float] = {}  # connection -> when, in that order
        self.timer: asyncio.TimerHandle | None = None

    def arm(self, waiter: HeadWaiter) -> None:
        """`waiter._head_timed_out()` once `timeout` seconds have passed, unless cleared."""
        pending = self.pending
        pending.pop(waiter, None)  # set again: its place moves to the end, with its time
        when = pending[waiter] = self.loop.time() + self.timeout
        if self.timer is None:
            self._set(when)

    def disarm(self, waiter: HeadWaiter) -> None:
        self.pending.pop(waiter, None)

    def _set(self, when: float) -> None:
        # An empty context: the callbacks are the connections', none the arming request's.
        self.timer = self.loop.call_at(when, self._fire, context=contextvars.Context())

    def _fire(self) -> None:
        self.timer = None
        pending, now, due = self.pending, self.loop.time(), []
        while pending:
            waiter, when = next(iter(pending.items()))
            if when > now:
                self._set(when)
                break
            del pending[waiter]
            due.append(waiter)
        for waiter in due:  # the timer is set again first: one connection's failure is its own
            try:
                self.due(waiter)
            except Exception as exc:
                self.loop.call_exception_handler(
                    {"message": "a request deadline failed", "exception": exc}
                )

    @staticmethod
    def due(waiter: HeadWaiter) -> None:
        waiter._head_timed_out()


class BodyWaiter(Protocol):
    def _body_timed_out(self) -> None: ...


class BodyDeadlines(HeadDeadlines):
    """The request-body deadlines of one listener's connections on one loop (`body`)."""

    __slots__ = ()

    @staticmethod
    def due(waiter: BodyWaiter) -> None:  # type: ignore[override]
        waiter._body_timed_out()


class HeadLimits:
    """The request-head deadline, size cap and CONNECT answer (see the module docstring):
    armed, counted and checked from the protocol's callbacks, the answers written straight
    to the transport."""

    __slots__ = ("_began", "_head_bytes", "_head_deadlines", "_in_head", "_refused")

    header_timeout: float | None = 10.0
    max_head_bytes: int = 32768 + 8192
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    # The class's deadlines (one per listener class and loop), made at the first connection
    _deadlines: HeadDeadlines | None = None
    _head_deadlines: HeadDeadlines | None  # where this connection's deadline is set, if it is
    _head_bytes: int
    _in_head: bool  # between requests or inside a request head
    _began: bool  # a request's first byte came and its head is not complete
    _refused: bool

    def _count_head(self, size: int) -> None:
        """`size` more bytes of a request head; past the cap, 431."""
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            message = f"request head over {self.max_head_bytes} bytes"
            self._refuse(answer(431, "request_header_fields_too_large", message))

    def _refuse_connect(self) -> None:
        allow = b"allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n"
        self._refuse(answer(405, "method_not_allowed", "CONNECT is not proxied", allow))

    def _arm(self) -> None:
        self._disarm()
        if self.header_timeout is None:
            return
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not self.loop:
            # A listener's class serves one loop; another loop (a second server of the
            # class) gets its own, and the connections of the first keep theirs.
            deadlines = type(self)._deadlines = HeadDeadlines(self.loop, self.header_timeout)
        deadlines.arm(self)
        self._head_deadlines = deadlines

    def _disarm(self) -> None:
        if self._head_deadlines is not None:
            self._head_deadlines.disarm(self)
            self._head_deadlines = None

    def _head_timed_out(self) -> None:
        self._head_deadlines = None
        if self._in_head and not self.transport.is_closing():
            if self._began:
                message = f"request head not complete within {self.header_timeout} s"
                self._refuse(answer(408, "request_timeout", message))
            else:
                self._refused = True
                self.transport.close()

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        self._disarm()
        self.transport.write(response)
        self.transport.close()
