"""One request's ASGI side (`RequestCycle`): its `receive`, its `send` and the task that runs
its app, on uvicorn's design (a per-request cycle with bound `send` and `receive`, flow
control an event) and by uvicorn's response rules (`sidecar.servers.response_head`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from middleware.types import ASGIApp, Message, Receive, Scope, Send
from sidecar.servers.http1.events import Flow, LazyEvent
from sidecar.servers.http1.nowait import withdraw
from sidecar.servers.response_head import response_head
from sidecar.servers.uvicorn_internals import ACCESS_LOG, ERROR_LOG

_TEXT = (b"content-type", b"text/plain; charset=utf-8")
_CLOSE = (b"connection", b"close")
_500 = [_TEXT, (b"content-length", b"21"), _CLOSE]  # uvicorn's answers, header for header
_503 = [_TEXT, (b"content-length", b"19"), _CLOSE]


class Connection(Protocol):
    """What a request tells its connection (`turns.Turns`, which imports this module)."""

    def on_response_complete(self) -> None: ...


async def service_unavailable(scope: Scope, receive: Receive, send: Send) -> None:
    """The app for a request past uvicorn's `limit_concurrency`: 503, as uvicorn answers."""
    await send({"type": "http.response.start", "status": 503, "headers": _503})
    await send({"type": "http.response.body", "body": b"Service Unavailable"})


class RequestCycle:
    """One request: its app's `receive` and `send`, the response head made by
    `response_head`, body writes without a list to join, and nothing waited on that is
    already there.

    The head is held until the response's first body write or the end of the loop turn it
    was sent in, whichever comes first: a stream's head and its first token, which mostly
    come in one upstream read, leave in one write. A system call fewer per response, and
    the one before the first token: on a reader that sleeps between writes, a small write
    costs far more than the copy (woken on another core). While the head is held,
    `chunked_encoding` stays None, so the `send_nowait` write refuses and the chunk comes
    through `send`.

    A head that raises (a bad header from the app) leaves the framing as it was: the
    response has started and `run_asgi` closes the connection.
    """

    # Slots: `flow`, `transport`, `disconnected`, `response_complete` and `chunked_encoding`
    # are read per chunk by the `send_nowait` write (`nowait`), the last three in place by
    # the compiled one (sidecar/_core.c's `slot_of`): keep their names.
    __slots__ = (
        "access_log",
        "body",
        "chunked_encoding",
        "connection",
        "default_headers",
        "disconnected",
        "expected_content_length",
        "flow",
        "held",
        "keep_alive",
        "loop",
        "message_event",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    logger = ERROR_LOG
    access_logger = ACCESS_LOG

    def __init__(
        self,
        scope: Scope,
        transport: asyncio.Transport,
        flow: Flow,
        loop: asyncio.AbstractEventLoop,
        connection: Connection,
        default_headers: list[tuple[bytes, bytes]],
        access_log: bool,
        expect_100_continue: bool,
        keep_alive: bool,
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.loop = loop
        # Told when the response completes; let go (None) once the app has returned.
        self.connection: Connection | None = connection
        self.default_headers = default_headers
        self.access_log = access_log
        # Nothing waits on the event yet: the request's task has not run.
        self.message_event = LazyEvent()
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.body: bytearray | bytes = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.held: tuple[bytes, bool | None] | None = None  # the head, its `chunked_encoding`

    async def run_asgi(self, app: ASGIApp) -> None:
        """The app, and what uvicorn does when it fails: 500 if no response started, else a
        close (the held head written first: a write after `close()` is dropped); the
        request's extension emptied at the end."""
        try:
            result: Any = await app(self.scope, self.receive, self.send)  # type: ignore[func-returns-value]
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self._close()
        else:
            if result is not None:
                msg = "ASGI callable should return None, but returned '%s'."
                self.logger.error(msg, result)
                self._close()
            elif not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.connection = None
            withdraw(self.scope)  # what the app left in the request's extension (`nowait`)

    async def send_500_response(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _500})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    def _close(self) -> None:
        self._write_held()
        self.transport.close()

    async def send(self, message: Message) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            self._start(message)
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            head = self._take_head()
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
                out = head
            elif self.chunked_encoding:
                if more_body:
                    out = b"%b%x\r\n%b\r\n" % (head, len(body), body) if body else head
                elif body:
                    out = b"%b%x\r\n%b\r\n0\r\n\r\n" % (head, len(body), body)
                else:
                    out = head + b"0\r\n\r\n"
            else:
                if len(body) > self.expected_content_length:
                    if head:
                        self.transport.write(head)  # as uvicorn had, at the start
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= len(body)
                out = head + body if head else body
            if out:
                self.transport.write(out)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self.transport.close()
                if self.connection is not None:
                    self.connection.on_response_complete()
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already completed."
            )

    def _start(self, message: Message) -> None:
        if message["type"] != "http.response.start":
            raise RuntimeError(
                f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
            )
        self.response_started = True
        self.waiting_for_100_continue = False
        status = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                _client(self.scope),
                self.scope["method"],
                _path_and_query(self.scope),
                self.scope["http_version"],
                status,
            )
        head, chunked, self.expected_content_length, self.keep_alive = response_head(
            status, headers, self.keep_alive, self.scope["method"] == "HEAD"
        )
        self.held = (head, chunked)
        self.loop.call_soon(self._write_held)

    def _take_head(self) -> bytes:
        """The held head, to be written now (b"" when none is held), its framing decided."""
        held = self.held
        if held is None:
            return b""
        self.held = None
        head, self.chunked_encoding = held
        return head

    def _write_held(self) -> None:
        """The loop turn the head was sent in has ended with no body write: write it now."""
        head = self._take_head()
        if head and not self.transport.is_closing():
            self.transport.write(head)

    async def receive(self) -> Message:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            if self.flow.read_paused:
                self.flow.resume_reading()
            if not self.message_event.is_set():
                await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        # Once the body is in whole, no byte comes for it any more: an open stream holds no
        # buffer of its own (`b""` is shared).
        self.body = bytearray() if self.more_body else b""
        return message


def _client(scope: Scope) -> str:
    """The access line's client, as uvicorn writes it."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]:d}" if client else ""


def _path_and_query(scope: Scope) -> str:
    """The access line's target, as uvicorn writes it."""
    path: str = scope["raw_path"].decode("latin1")
    if scope["query_string"]:
        path += "?" + scope["query_string"].decode("ascii")
    return path
