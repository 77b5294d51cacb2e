"""`--body-timeout` for the servers that keep no body deadline of their own: hypercorn (the
`--http2` listener) and uvicorn's public path (`uvicorn_listener.use_internals` said no).
The sidecar's own HTTP/1.1 protocol keeps it where the bytes are read
(`http1.body`), from the end of the head, trailers included.

Here the app is wrapped (`BodyDeadline`): each HTTP request's body must be whole within
`timeout` seconds of the app being called, which is when the head has been read. The
deadline is checked while the app waits for the body: a server holds a body back while its
app does not read it (flow control), and that wait is not the client's, so what arrived
meanwhile is still delivered however late the app asks. Past it: 408 with a JSON error body
if no response has started (HTTP/1.1: `connection: close`), and the app hears
`http.disconnect`, which frees its `--max-streams` slot; what it sends after that is dropped.

hypercorn drops request trailers itself (h11's end of message and h2's trailers event are
never passed on) and bounds them as it bounds a head (`h11_max_incomplete_size`, the h2
header list size): nothing to add here for those.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

from middleware.types import ASGIApp, Message, Receive, Scope, Send

DISCONNECT: Message = {"type": "http.disconnect"}


class BodyDeadline:
    """`app` with a deadline on each HTTP request's body (see the module docstring);
    `timeout` None: `app` as it is."""

    def __init__(self, app: ASGIApp, timeout: float | None) -> None:
        self.app = app
        self.timeout = timeout

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http" or self.timeout is None:
            return self.app(scope, receive, send)
        body = TimedBody(scope, receive, send, self.timeout)
        return self.app(scope, body.receive, body.send)


class TimedBody:
    """One request's `receive` and `send`, under its body's deadline."""

    __slots__ = ("_receive", "_send", "deadline", "expired", "http1", "started", "timeout", "whole")

    def __init__(self, scope: Scope, receive: Receive, send: Send, timeout: float) -> None:
        self._receive, self._send = receive, send
        self.timeout = timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.http1 = scope.get("http_version", "1.1") in ("1.0", "1.1")
        self.whole = False  # the body is in: the server's receive as it is from here on
        self.started = False  # a response has started
        self.expired = False

    async def receive(self) -> Message:
        if self.whole:
            return await self._receive()
        if self.expired:
            return DISCONNECT
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self._receive()
        except TimeoutError:
            await self._expire()
            return DISCONNECT
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.whole = True
        return message

    async def send(self, message: Message) -> None:
        if self.expired:
            return  # answered 408, or cut: the app's response goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _expire(self) -> None:
        self.expired = True
        if self.started:
            return
        self.started = True
        error = {
            "message": f"request body not complete within {self.timeout} s",
            "type": "invalid_request_error",
            "code": "request_timeout",
        }
        body = json.dumps({"error": error}, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if self.http1:
            headers.append((b"connection", b"close"))
        await self._send({"type": "http.response.start", "status": 408, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
