"""The per-request cycle: uvicorn's, with its `send` and `receive` written for the sidecar."""

from __future__ import annotations

import logging

from uvicorn._types import ASGIReceiveEvent, ASGISendEvent, HTTPRequestEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from sidecar.servers.response_head import response_head
from sidecar.servers.uvicorn_internals.events import LazyEvent


class RequestCycle(RequestResponseCycle):
    """uvicorn's per-request cycle (its `run_asgi`, `send_500_response`) with its `send` and
    `receive` written for the sidecar: the response head made by `response_head`, body
    writes without a list to join, and nothing waited on that is already there.

    A head that raises (a bad header from the app) leaves the framing as it was, where
    uvicorn's loop leaves what it had set before the bad header: either way the response has
    started and `run_asgi` closes the connection.
    """

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
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                if more_body:
                    if body:
                        self.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
                elif body:
                    self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
                else:
                    self.transport.write(b"0\r\n\r\n")
            else:
                if len(body) > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= len(body)
                if body:
                    self.transport.write(body)
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
        head, self.chunked_encoding, self.expected_content_length, self.keep_alive = response_head(
            status, headers, keep_alive=self.keep_alive, head_request=self.scope["method"] == "HEAD"
        )
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
