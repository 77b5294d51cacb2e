"""The per-request cycle: uvicorn's, with its `send` and `receive` written for the sidecar."""

from __future__ import annotations

import logging

from uvicorn._types import ASGI3Application, ASGIReceiveEvent, ASGISendEvent, HTTPRequestEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from sidecar.servers.response_head import response_head
from sidecar.servers.uvicorn_internals.events import LazyEvent
from sidecar.servers.uvicorn_internals.nowait import withdraw


class RequestCycle(RequestResponseCycle):
    """uvicorn's per-request cycle (its `send_500_response`) with its `run_asgi`, `send` and
    `receive` written for the sidecar: the response head made by `response_head`, body
    writes without a list to join, and nothing waited on that is already there.

    The head is held until the response's first body write or the end of the loop turn it
    was sent in, whichever comes first: a stream's head and its first token, which mostly
    come in one upstream read, leave in one write. A system call fewer per response, and
    the one before the first token: on a reader that sleeps between writes, a small write
    costs ~20 µs (woken on another core). While the head is held, `chunked_encoding` stays
    None, so the `send_nowait` write refuses and the chunk comes through `send`.

    A head that raises (a bad header from the app) leaves the framing as it was, where
    uvicorn's loop leaves what it had set before the bad header: either way the response has
    started and `run_asgi` closes the connection.
    """

    # The three fields the `send_nowait` write reads per chunk (`nowait`): slots, so that the
    # compiled writer reads them in place (sidecar/_core.c's `slot_of`). uvicorn's other
    # fields stay in the instance dict.
    __slots__ = ("chunked_encoding", "disconnected", "response_complete")

    # The protocol's two loggers (`protocol.GuardedHttpToolsProtocol`), the same objects.
    logger = logging.getLogger("uvicorn.error")
    access_logger = logging.getLogger("uvicorn.access")

    def __init__(self, protocol: HttpToolsProtocol, keep_alive: bool) -> None:
        # uvicorn's fields, from the protocol it passes them from; the loggers are the class's.
        self.scope = protocol.scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.access_log = protocol.access_log
        self.default_headers = protocol.server_state.default_headers
        # Nothing waits on the event yet: the request's task has not run.
        self.message_event = LazyEvent()  # type: ignore[assignment]
        self.on_response = protocol.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding = None
        self.expected_content_length = 0
        self.loop = protocol.loop
        self.held: tuple[bytes, bool | None] | None = None  # the head, its `chunked_encoding`

    async def run_asgi(self, app: ASGI3Application) -> None:
        """uvicorn's, with the held head written before each close of a started response
        (a write after `close()` is dropped), and the request's extension emptied at the end."""
        try:
            result = await app(self.scope, self.receive, self.send)  # type: ignore[func-returns-value]
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
            self.on_response = lambda: None
            withdraw(self.scope)  # what the app left in the request's extension (`nowait`)

    def _close(self) -> None:
        self._write_held()
        self.transport.close()

    async def send(self, message: ASGISendEvent) -> None:
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
                self.on_response()
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already completed."
            )

    def _start(self, message: ASGISendEvent) -> None:
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
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
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

    async def receive(self) -> ASGIReceiveEvent:
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
        message: HTTPRequestEvent = {
            "type": "http.request",
            "body": bytes(self.body),
            "more_body": self.more_body,
        }
        self.body = bytearray()
        return message
