"""The traffic protocol's request-head limits (`HeadLimits`), and the answers it writes
when one is crossed.

The traffic protocol adds what nginx calls `client_header_timeout` and
`large_client_header_buffers`. uvicorn reads a request head for as long as the client
cares to trickle it, and lets the head grow without bound before the app sees it: one
slowloris client per file descriptor holds the sidecar open forever. So:

- a request head (request line and headers) must be complete within `header_timeout`
  seconds of the connection opening, or of its first byte on a kept-alive connection
  (between requests uvicorn's own `timeout_keep_alive` applies); past it: 408 and close
  (a connection that sent nothing is just closed);
- a head larger than `max_head_bytes` is answered 431 and closed; a head is held in memory
  up to that cap plus one read;
- `CONNECT` (authority-form target, which uvicorn cannot parse into a path) gets 405, like
  `TRACE` does in the proxy, instead of uvicorn's 400.

Deliberate: the timer is armed per connection and per request head, never per read; reads
only add to a byte count. The answers are written straight to the transport: no ASGI
request exists yet.
"""

from __future__ import annotations

import asyncio
import json

_REASONS = {
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
}


def _answer(status: int, code: str, message: str, extra: bytes = b"") -> bytes:
    error = {"message": message, "type": "invalid_request_error", "code": code}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n%s" % (status, _REASONS[status], len(body), extra, body)
    )


class HeadLimits:
    """The request-head deadline, size cap and CONNECT answer (see the module docstring):
    armed, counted and checked from the protocol's callbacks, the answers written straight
    to the transport. Its fields are in the protocol's slots."""

    header_timeout: float | None = 10.0
    max_head_bytes: int = 32768 + 8192
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _head_timer: asyncio.TimerHandle | None
    _head_bytes: int
    _in_head: bool  # between requests or inside a request head
    _began: bool  # a request's first byte came and its head is not complete
    _refused: bool

    def _count_head(self, size: int) -> None:
        """`size` more bytes of a request head; past the cap, 431."""
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            message = f"request head over {self.max_head_bytes} bytes"
            self._refuse(_answer(431, "request_header_fields_too_large", message))

    def _refuse_connect(self) -> None:
        allow = b"allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n"
        self._refuse(_answer(405, "method_not_allowed", "CONNECT is not proxied", allow))

    def _arm(self) -> None:
        self._disarm()
        if self.header_timeout is not None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            if self._began:
                message = f"request head not complete within {self.header_timeout} s"
                self._refuse(_answer(408, "request_timeout", message))
            else:
                self._refused = True
                self.transport.close()

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        self._disarm()
        self.transport.write(response)
        self.transport.close()
