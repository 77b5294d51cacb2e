"""The traffic listener's HTTP/1.1 protocol: uvicorn's httptools protocol with its
callbacks written out, the request-head limits (`limits`), the request-body limits (`body`)
and the `send_nowait` offer (`nowait`) in line.

Memory per open connection, which thousands of idle streams multiply: the protocol keeps
its own fields in slots (uvicorn's instance dict is near CPython's limit for key-sharing
dicts, past which each instance carries a dict of its own four times the size); the request
pipeline (a queue only HTTP pipelining fills) is a list, not a deque with its block of 64
slots; the two events uvicorn makes per connection and per request, of which most are
never waited on, make their waiter list at the first wait; and the request parser (with the
protocol's callbacks it holds) is dropped once a request has been read whole, and made
again when the client sends more: a stream's client seldom does.

A closed connection's objects go when their last reference does, not at the cyclic
collector's next full pass (which a busy sidecar may not reach for a long time): the
connection drops what it holds of its requests when it is lost (a request's scope holds the
extension, whose `abort` holds the connection), and a request's extension drops its
functions once its app has returned (`nowait.withdraw`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.config import Config
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import is_ssl
from uvicorn.server import ServerState

from sidecar.servers.uvicorn_internals.body import BodyLimits
from sidecar.servers.uvicorn_internals.connection import (
    _addresses,
    _request_parser,
    _serve,
    read_headers,
    target,
)
from sidecar.servers.uvicorn_internals.cycle import RequestCycle
from sidecar.servers.uvicorn_internals.events import Flow, Pipeline
from sidecar.servers.uvicorn_internals.nowait import NowaitOffer


class GuardedHttpToolsProtocol(BodyLimits, HttpToolsProtocol, NowaitOffer):
    """uvicorn's httptools protocol plus a request-head deadline, a head size cap and CONNECT
    405 (`limits.HeadLimits`), a request-body deadline and a trailer cap (`BodyLimits`, which
    writes out uvicorn's `on_body`), and the `sidestream.send_nowait` extension
    (`NowaitOffer`).

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
        "_bare_chunk",
        "_began",
        "_body_deadlines",
        "_head_bytes",
        "_head_deadlines",
        "_in_head",
        "_read_whole",
        "_refused",
        "_told_cycle",
        "_told_offer",
        "_trailer_bytes",
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
        self._head_deadlines = self._body_deadlines = None
        self._in_head = True
        self._head_bytes = self._trailer_bytes = 0
        self._refused = self._began = self._bare_chunk = False
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
        if self._head_deadlines is not None:
            self._disarm()
        if self._body_deadlines is not None:
            self._disarm_body()
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
        if self.timeout_keep_alive_task is not None:  # uvicorn's only when `exc` is None
            self._unset_keepalive_if_required()
        self.parser = None  # type: ignore[assignment]
        self._tell_gone()
        self._let_go()  # of its requests, which hold it (see the module docstring)
        self.scope = self.headers = self.cycle = None  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        if self.parser is None:  # dropped once the last request was read whole
            self.parser = _request_parser(self)
        was_in_head, bare, trailers = self._in_head, self._bare_chunk, self._trailer_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refused:
                return  # a limit has answered the request from a callback (`body.StopParsing`)
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if was_in_head and self._in_head and not self._refused:  # all of `data` was head
            self._count_head(len(data))
        elif bare and self._bare_chunk:  # all of it came after the last chunk: trailers
            self._trailer_bytes = trailers  # each byte counted once, whatever fields it ended
            self._count_trailer(len(data))
        if self._body_deadlines is None and not (
            self._in_head or self._read_whole or self._refused
        ):
            self._arm_body()  # a head is in and its body is not: the body's deadline
        if self._read_whole and self.parser is not None:
            # Between two requests a new parser is as good as this one, and most streams'
            # clients send nothing more: made again when they do.
            self.parser = None  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        self._in_head = True  # a request's first byte: on a kept-alive connection, arm now
        self._head_bytes = 0
        self._began = True
        self._read_whole = self._bare_chunk = False
        self._trailer_bytes = 0
        if self._head_deadlines is None:
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
        if self._in_head:
            self.headers.append((name, value))  # as read: made uvicorn's all at once, below
        else:  # a trailer field: counted, never one of the request's headers (`body`)
            self._on_trailer(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = self._began = False
        if self._head_deadlines is not None:
            self._disarm()
        parser, scope = self.parser, self.scope
        method = parser.get_method()
        if method == b"CONNECT":
            self._refuse_connect()
            return
        if self.headers:
            self.expect_100_continue = read_headers(self.headers)
        http_version = parser.get_http_version()
        scope["method"] = method.decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return  # an upgrade: no request task is made for this head
        raw_path, query = target(self.url)
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        if self.root_path:
            path = self.root_path + path
            raw_path = self.root_path.encode("ascii") + raw_path
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = query
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
        if self._body_deadlines is not None:
            self._disarm_body()
        # An upgrade's parser stays: it is paused, and what it makes of later bytes is its own.
        upgrade = self.parser.should_upgrade()
        self._read_whole = not upgrade
        self._bare_chunk = False
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


def protocol_class(
    header_timeout: float | None,
    max_head_bytes: int,
    body_timeout: float | None = BodyLimits.body_timeout,
    max_trailer_bytes: int = BodyLimits.max_trailer_bytes,
) -> type[GuardedHttpToolsProtocol]:
    """A `GuardedHttpToolsProtocol` with these limits, for `uvicorn.Config(http=...)`."""
    limits = {
        "header_timeout": header_timeout,
        "max_head_bytes": max_head_bytes,
        "body_timeout": body_timeout,
        "max_trailer_bytes": max_trailer_bytes,
    }
    return type(
        "GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {**limits, "__slots__": ()}
    )
