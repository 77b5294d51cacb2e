"""Every use of uvicorn's private internals: the traffic listener's HTTP/1.1 protocol and the
servers' main loop.

Checked against uvicorn 0.55.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
version's major.minor is one checked and every hook overridden here still exists. When it
says no, `sidecar.servers.uvicorn_listener` serves with the public path instead — uvicorn's
own `http="httptools"` protocol and main loop — and logs one line at start. A runtime gate,
not a bound in pyproject, because that public path serves every stream correctly: what it
loses is the `sidestream.send_nowait` fast path and the request-head limits below, not
correctness, and an upper bound would block users from uvicorn's own fixes.

Private names used (only when the gate says yes, except `capture_signals`):
- `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`: subclassed. Its `__init__` and
  the callbacks run for every connection and request (`connection_made`, `connection_lost`,
  `data_received`, `on_message_begin`, `on_header`, `on_headers_complete`,
  `on_message_complete`, `on_response_complete`) are written out here with the sidecar's
  additions in line, setting uvicorn's fields for the methods of its that still run
  (`on_url`, `on_body`, `_start_asgi_task`, `send_400_response`, the upgrade ones,
  `shutdown`, the keep-alive timeout); `_unsupported_upgrade_warning` overridden; `parser`
  dropped between requests and made again as uvicorn makes it.
- `RequestResponseCycle`: subclassed (`RequestCycle`): `__init__`, `send` and `receive`
  written out (the head by `sidecar.servers.response_head`, uvicorn's rules), `run_asgi`
  and `send_500_response` uvicorn's. Its `flow.write_paused`, `disconnected`,
  `response_complete`, `chunked_encoding` and `transport` are read per chunk by the
  `send_nowait` extension (here, and in its compiled twin, `sidecar/_core.c`'s
  `ChunkWriter`); `disconnected` set and `response_complete` read when the connection is
  lost (the extension's `on_disconnect`).
- the protocol's `pipeline`, `flow` (`FlowControl`, subclassed) and each cycle's
  `message_event`, made as lighter objects with the same methods (below).
- `uvicorn.protocols.utils`' address functions, for a transport that did not keep the
  addresses it accepted on (the protocol asks the transport: uvicorn asks the socket, each
  time through a socket object made for the question, two more system calls each).
- `uvicorn.Server`: `capture_signals` (replaced on both paths: uvicorn has no public switch
  for its signal handlers, and the sidecar decides what a signal means — drain first),
  `main_loop` and `on_tick` (replaced only behind the gate).

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

Memory per open connection, which thousands of idle streams multiply: the protocol keeps
its own fields in slots (uvicorn's instance dict is near CPython's limit for key-sharing
dicts, past which each instance carries a dict of its own four times the size); the request
pipeline (a queue only HTTP pipelining fills) is a list, not a deque with its block of 64
slots; the two events uvicorn makes per connection and per request, of which most are
never waited on, make their waiter list at the first wait; and the request parser (with the
protocol's callbacks it holds) is dropped once a request has been read whole, and made
again when the client sends more: a stream's client seldom does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Generator
from itertools import repeat
from typing import Any, Literal
from urllib.parse import unquote

import httptools
import uvicorn
from uvicorn._types import ASGIReceiveEvent, ASGISendEvent, HTTPRequestEvent, HTTPScope
from uvicorn.config import Config
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl, service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import (
    get_client_addr,
    get_local_addr,
    get_path_with_query_string,
    get_remote_addr,
    is_ssl,
)
from uvicorn.server import ServerState

from middleware.types import SEND_NOWAIT, SendNowait
from sidecar.servers.listener import ExitEvent
from sidecar.servers.response_head import response_head
from sidecar.speedups import core

CHECKED = ("0.55",)  # uvicorn major.minor releases these internals were read in

_PROTOCOL_HOOKS = (  # written out here, or called by name
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_header",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "_unsupported_upgrade_warning",
    "_should_upgrade",
    "handle_websocket_upgrade",
    "send_400_response",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
    "timeout_keep_alive_handler",
)
_CYCLE_HOOKS = ("send", "receive", "run_asgi")
_SERVER_HOOKS = ("capture_signals", "main_loop", "on_tick")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed uvicorn) one these internals were checked
    against, with every hook this module overrides still there?"""
    version = uvicorn.__version__ if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    hooks = [getattr(HttpToolsProtocol, name, None) for name in _PROTOCOL_HOOKS]
    hooks += [getattr(RequestResponseCycle, name, None) for name in _CYCLE_HOOKS]
    hooks += [getattr(uvicorn.Server, name, None) for name in _SERVER_HOOKS]
    return all(callable(hook) for hook in hooks)


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


class LazyEvent:
    """What uvicorn calls of an `asyncio.Event` (`set`, `clear`, `is_set`, `wait`), with the
    waiter list made at the first `wait()`: an `asyncio.Event` makes a deque at once."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for waiter in self._waiters or ():
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> Literal[True]:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)


class Pipeline(list[Any]):
    """uvicorn's queue of pipelined requests, of which it calls `appendleft`, `pop` and
    truth: a list (an empty one holds no item array), where uvicorn makes a deque."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


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


class NowaitOffer:
    """The `sidestream.send_nowait` extension offered in a request's scope (see
    `middleware.types`): its `send` (`send_nowait`), its `abort`, and for the first request
    of the connection not yet complete an `on_disconnect` slot, called when the client goes.
    Its fields are in the protocol's slots."""

    cycle: RequestResponseCycle
    pipeline: deque[tuple[RequestResponseCycle, Any]]
    transport: asyncio.Transport
    # The request whose extension takes an `on_disconnect` listener: the first one not
    # complete (a request pipelined behind it gets none, and its guard reads receive()).
    _told_cycle: RequestResponseCycle | None
    _told_offer: dict[object, object] | None

    def _offer(self, cycle: RequestResponseCycle, scope: HTTPScope) -> None:
        offer: dict[object, object] = {"send": send_nowait(cycle), "abort": self._drop}
        told = self._told_cycle
        if told is None or told.response_complete:
            offer["on_disconnect"] = None  # free for a listener (middleware.types)
            self._told_cycle, self._told_offer = cycle, offer
        scope["extensions"] = {SEND_NOWAIT: offer}

    def _tell_gone(self) -> None:
        """The connection is lost: the told request, if not complete, is marked so (uvicorn
        marks only the newest request's) and its listener called."""
        cycle, offer = self._told_cycle, self._told_offer
        if cycle is not None and offer is not None and not cycle.response_complete:
            cycle.disconnected = True
            listener = offer.get("on_disconnect")
            if callable(listener):
                listener()

    def _drop(self) -> None:
        """The extension's `abort`: drop the client now. uvicorn logs an app that returns
        with its response incomplete as an error unless the client is gone: every request
        of the connection is marked gone (the one asking, and any pipelined behind it)."""
        for cycle in (self._told_cycle, self.cycle, *(queued for queued, _ in self.pipeline)):
            if cycle is not None:
                cycle.disconnected = True
        self.transport.close()


class GuardedHttpToolsProtocol(HttpToolsProtocol, HeadLimits, NowaitOffer):
    """uvicorn's httptools protocol plus a request-head deadline, a head size cap and CONNECT
    405 (`HeadLimits`), and the `sidestream.send_nowait` extension (`NowaitOffer`).

    Configure by subclassing (see `protocol_class`): uvicorn builds one instance per
    connection with its own keyword arguments.

    uvicorn's callbacks for each connection and each request are written out here, the
    sidecar's additions in line; its other methods run as they are, on the fields set here.
    What uvicorn sets alike on every connection is set once: its two loggers (which it looks
    up per connection) and what a server passes each connection (`_serve`). A connection's
    addresses come from the transport, which read them at accept.
    """

    # Slots (this class's and its two parts' fields): uvicorn's own fields stay in the
    # instance dict, and stay few enough for it to share its keys with every other
    # connection's (see the module docstring).
    __slots__ = (
        "_began",
        "_head_bytes",
        "_head_timer",
        "_in_head",
        "_read_whole",
        "_refused",
        "_told_cycle",
        "_told_offer",
    )

    logger = logging.getLogger("uvicorn.error")
    access_logger = logging.getLogger("uvicorn.access")
    _served: ServerState | None = None  # the server whose fields the class holds (_serve)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if self._served is not server_state:
            _serve(self, config, server_state, app_state, _loop)
        self.access_log = self.access_logger.hasHandlers()
        self.parser = None  # type: ignore[assignment]  # made at the first bytes
        self.timeout_keep_alive_task = None
        self.transport = None  # type: ignore[assignment]
        self.flow = None  # type: ignore[assignment]
        self.server = None
        self.client = None
        self.scheme = None
        self.pipeline = Pipeline()  # type: ignore[assignment]  # uvicorn's methods, a list
        self.scope = None  # type: ignore[assignment]
        self.headers = None  # type: ignore[assignment]
        self.expect_100_continue = False
        self.cycle = None  # type: ignore[assignment]
        self._head_timer = None
        self._in_head = True
        self._head_bytes = 0
        self._refused = False
        self._began = False
        self._read_whole = False  # the last request was parsed to its end, nothing after it
        self._told_cycle = self._told_offer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.connections.add(self)
        self.transport = transport
        self.flow = Flow(transport)
        self.server, self.client = _addresses(transport)
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            self._trace("HTTP connection made")
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._disarm()
        self.connections.discard(self)
        if self.logger.level <= TRACE_LOG_LEVEL:
            self._trace("HTTP connection lost")
        if self.cycle is not None:
            if not self.cycle.response_complete:
                self.cycle.disconnected = True
            self.cycle.message_event.set()
        if self.flow is not None and self.flow.write_paused:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
            if self.timeout_keep_alive_task is not None:
                self._unset_keepalive_if_required()
        self.parser = None  # type: ignore[assignment]
        self._tell_gone()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        if self.parser is None:  # dropped once the last request was read whole
            self.parser = _request_parser(self)
        was_in_head = self._in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if was_in_head and self._in_head and not self._refused:  # all of `data` was head
            self._count_head(len(data))
        if self._read_whole and self.parser is not None:
            # Between two requests a new parser is as good as this one, and most streams'
            # clients send nothing more: made again when they do.
            self.parser = None  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        self._in_head = True  # a request's first byte: on a kept-alive connection, arm now
        self._head_bytes = 0
        self._began = True
        self._read_whole = False
        if self._head_timer is None:
            self._arm()
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))  # as read: made uvicorn's all at once, below

    def on_headers_complete(self) -> None:
        self._in_head = self._began = False
        if self._head_timer is not None:
            self._disarm()
        parser, scope = self.parser, self.scope
        method = parser.get_method()
        if method == b"CONNECT":
            self._refuse_connect()
            return
        if self.headers:
            self.expect_100_continue = _read_headers(self.headers)
        http_version = parser.get_http_version()
        scope["method"] = method.decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return  # an upgrade: no request task is made for this head
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        if self.root_path:
            path = self.root_path + path
            raw_path = self.root_path.encode("ascii") + raw_path
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = url.query or b""
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")

        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        cycle = RequestCycle(self, keep_alive)
        if method != b"HEAD":  # HEAD responses have no body
            self._offer(cycle, scope)
        existing, self.cycle = self.cycle, cycle
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:  # pipelined: queued until the one before it is answered
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def _trace(self, message: str) -> None:
        prefix = f"{self.client[0]}:{self.client[1]:d} - " if self.client else ""
        self.logger.log(TRACE_LOG_LEVEL, "%s%s", prefix, message)

    def on_message_complete(self) -> None:
        # An upgrade's parser stays: it is paused, and what it makes of later bytes is its own.
        upgrade = self.parser.should_upgrade()
        self._read_whole = not upgrade
        if (upgrade and self._should_upgrade()) or self.cycle.response_complete:
            return
        self.cycle.more_body = False
        self.cycle.message_event.set()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.pipeline:  # the next pipelined request starts
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _unsupported_upgrade_warning(self) -> None:
        if not self._refused:  # CONNECT already answered: nothing to warn about
            super()._unsupported_upgrade_warning()


def _serve(
    protocol: GuardedHttpToolsProtocol,
    config: Config,
    server_state: ServerState,
    app_state: dict[str, Any],
    loop: asyncio.AbstractEventLoop | None,
) -> None:
    """uvicorn's fields that every connection of a server has alike: kept on the protocol's
    class for the first server that uses it (`protocol_class` makes a class per listener),
    set on each connection, as uvicorn sets them, for any other server."""
    on_class = type(protocol)._served is None
    owner: Any = type(protocol) if on_class else protocol
    if not config.loaded:
        config.load()
    owner.config = config
    # On the class a plain function would be bound to the connection as a method.
    owner.app = staticmethod(config.loaded_app) if on_class else config.loaded_app
    owner.loop = loop or asyncio.get_event_loop()
    owner.ws_protocol_class = config.ws_protocol_class
    owner.root_path = config.root_path
    owner.asgi_version = config.asgi_version
    owner.limit_concurrency = config.limit_concurrency
    owner.app_state = app_state
    owner.timeout_keep_alive = config.timeout_keep_alive
    owner.server_state = server_state
    owner.connections = server_state.connections
    owner.tasks = server_state.tasks
    owner._served = server_state


class RequestCycle(RequestResponseCycle):
    """uvicorn's per-request cycle (its `run_asgi`, `send_500_response`) with its `send` and
    `receive` written for the sidecar: the response head made by `response_head`, body
    writes without a list to join, and nothing waited on that is already there.

    A head that raises (a bad header from the app) leaves the framing as it was, where
    uvicorn's loop leaves what it had set before the bad header: either way the response has
    started and `run_asgi` closes the connection.
    """

    logger = GuardedHttpToolsProtocol.logger
    access_logger = GuardedHttpToolsProtocol.access_logger

    def __init__(self, protocol: GuardedHttpToolsProtocol, keep_alive: bool) -> None:
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


class Flow(FlowControl):
    """uvicorn's flow control with its writable event a `LazyEvent` from the start (uvicorn's
    makes an `asyncio.Event`)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event = LazyEvent(True)  # type: ignore[assignment]


def _read_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    """uvicorn's `on_header`, for all of a request's headers at once, in place: names
    lower-cased, values without the trailing blanks llhttp keeps. Is one of them
    `expect: 100-continue`?"""
    names, values = zip(*headers, strict=True)
    names = tuple(map(bytes.lower, names))
    headers[:] = zip(names, map(bytes.rstrip, values, repeat(b" \t")), strict=True)
    return b"expect" in names and (b"expect", b"100-continue") in (
        (name, value.lower()) for name, value in headers
    )


def _addresses(
    transport: asyncio.Transport,
) -> tuple[tuple[str, int | None] | None, tuple[str, int] | None]:
    """uvicorn's `get_local_addr` and `get_remote_addr`, from the addresses the event loop
    read at accept (uvloop and asyncio keep them in the transport's extra info): uvicorn's
    ask the socket again, each through a socket object made for the question. An address
    that is not a (host, port, ...) tuple (a Unix socket's) is left to uvicorn's."""
    local, remote = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
    if isinstance(local, tuple) and isinstance(remote, tuple):
        return local[:2], remote[:2]
    return get_local_addr(transport), get_remote_addr(transport)


_LENIENT = hasattr(httptools.HttpRequestParser, "set_dangerous_leniencies")  # httptools >= 0.6.3


def _request_parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    """A request parser for `protocol`, as uvicorn makes one."""
    parser = httptools.HttpRequestParser(protocol)
    if _LENIENT:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def send_nowait(cycle: RequestResponseCycle) -> SendNowait:
    """The `SEND_NOWAIT` extension for one request: a chunked body write straight to the
    transport, what uvicorn's `send` does for such a message, when nothing needs waiting for.
    Compiled where built: `sidecar/_core.c`'s `ChunkWriter`, this closure line for line."""
    if core is not None:
        writer: SendNowait = core.ChunkWriter(cycle)
        return writer

    flow, write = cycle.flow, cycle.transport.write  # the connection's: fixed for the cycle

    def send_nowait(body: bytes) -> bool:
        # `chunked_encoding` is None until the response has started, and True only for a
        # chunked body (uvicorn's choice when no Content-Length was given).
        if (
            flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or not cycle.chunked_encoding
        ):
            return False
        write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    return send_nowait


def protocol_class(
    header_timeout: float | None, max_head_bytes: int
) -> type[GuardedHttpToolsProtocol]:
    """A `GuardedHttpToolsProtocol` with these limits, for `uvicorn.Config(http=...)`."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout": header_timeout, "max_head_bytes": max_head_bytes, "__slots__": ()},
    )


class QuietServer(ExitEvent, uvicorn.Server):
    """uvicorn without its own signal handlers: the Sidecar decides what a signal means. Its
    main loop is uvicorn's own, which polls `should_exit` (the public path's server)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        self._up = asyncio.Event()
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class EventServer(QuietServer):
    """`QuietServer` without uvicorn's 10 Hz poll of `should_exit`: the main loop waits on
    the event the flag sets, so an idle sidecar is never woken (the wake-ups of two polling
    servers showed up in benchmark windows). uvicorn's tick also refreshes the date header
    once a second; the sidecar sends none."""

    async def main_loop(self) -> None:
        # One tick sets the default headers (none: no date, no server header); uvicorn's other
        # per-tick duty, `limit_max_requests`, is never configured by the sidecar.
        await self.on_tick(0)
        await self._exit.wait()
