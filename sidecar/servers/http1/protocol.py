"""The traffic listener's HTTP/1.1 protocol (`Http1Protocol`), handed to uvicorn by
`Config(http=...)` (what uvicorn's `Server` asks of it: `sidecar.servers.uvicorn_internals`).
It serves as uvicorn's own httptools protocol serves (keep-alive, pipelining, flow control,
400 for a request it cannot parse, `Expect: 100-continue`, a WebSocket upgrade handed on),
with the request-head and body limits and the `send_nowait` offer in line.

Memory per open connection, which thousands of idle streams multiply: every field is a slot
(no instance dict); what a server passes each connection is one shared object (`Served`);
the request pipeline (a queue only HTTP pipelining fills) is a list made when a request
first waits in it, not a deque with its block of 64 slots; a request holds the connection
itself, not a bound method of it (`cycle.RequestCycle.connection`); the events made per
connection and per request, of which most are never waited on, make their waiter list at the
first wait (`events`); and the request parser (with the protocol's callbacks it holds) is
dropped once a request has been read whole, and made again when the client sends more: a
stream's client seldom does.

A closed connection's objects go when their last reference does, not at the cyclic
collector's next full pass (which a busy sidecar may not reach for a long time): a lost
connection drops what it holds of its requests (a request's scope holds the extension,
whose `abort` holds the connection), and a request's extension drops its functions once its
app has returned (`nowait.withdraw`).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn.server import ServerState

from middleware.types import ASGIApp
from sidecar.servers.http1.body import BodyLimits
from sidecar.servers.http1.connection import addresses, locate, read_headers, request_parser
from sidecar.servers.http1.cycle import RequestCycle, service_unavailable
from sidecar.servers.http1.events import Flow
from sidecar.servers.http1.limits import bad_request
from sidecar.servers.http1.nowait import NowaitOffer
from sidecar.servers.http1.turns import Turns
from sidecar.servers.http1.upgrade import Upgrades
from sidecar.servers.uvicorn_internals import ACCESS_LOG, ERROR_LOG, TRACE, Served


class Http1Protocol(BodyLimits, Turns, Upgrades, NowaitOffer, asyncio.Protocol):
    """One HTTP/1.1 connection: its requests parsed, each run as its app's task
    (`cycle.RequestCycle`) in turn (`Turns`), with the request-head limits
    (`limits.HeadLimits`), the request-body limits (`BodyLimits`) and the
    `sidestream.send_nowait` extension (`NowaitOffer`).

    Configure by subclassing (see `protocol_class`): uvicorn makes one instance per
    connection with its own keyword arguments.
    """

    __slots__ = (
        "__weakref__",  # a connection can be watched (a test's `weakref`), as uvicorn's can
        "_keep_alive",
        "_told_cycle",
        "_told_offer",
        "access_log",
        "client",
        "cycle",
        "expect_100_continue",
        "flow",
        "headers",
        "loop",
        "parser",
        "pipeline",
        "scheme",
        "scope",
        "served",
        "server",
        "transport",
        "url",
    )

    logger = ERROR_LOG
    _served: ClassVar[Served | None] = None  # the server the class was last made for

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        served = self._served
        if served is None or served.state is not server_state or served.config is not config:
            served = type(self)._served = Served(config, server_state, app_state, _loop)
        self.served = served
        self.loop = served.loop
        self.access_log = ACCESS_LOG.hasHandlers()
        self.parser: httptools.HttpRequestParser | None = None  # made at the first bytes
        self._keep_alive: asyncio.TimerHandle | None = None
        self.transport = None  # type: ignore[assignment]
        self.flow = None  # type: ignore[assignment]
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.pipeline: list[tuple[RequestCycle, ASGIApp]] | None = None  # made when one waits
        self.scope: dict[str, Any] = None  # type: ignore[assignment]
        self.headers: list[tuple[bytes, bytes]] = None  # type: ignore[assignment]
        self.url = b""
        self.expect_100_continue = False
        self.cycle: RequestCycle | None = None
        self._head_deadlines = self._body_deadlines = None
        self._in_head = True
        self._head_bytes = self._trailer_bytes = 0
        self._refused = self._began = self._bare_chunk = False
        self._read_whole = False  # the last request was parsed to its end, nothing after it
        self._told_cycle = self._told_offer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.served.connections.add(self)
        self.transport = transport
        self.flow = Flow(transport)
        self.server, self.client = addresses(transport)
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        if self.logger.level <= TRACE:
            self._trace("HTTP connection made")
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadlines is not None:
            self._disarm()
        if self._body_deadlines is not None:
            self._disarm_body()
        self.served.connections.discard(self)
        if self.logger.level <= TRACE:
            self._trace("HTTP connection lost")
        if self.cycle is not None:
            if not self.cycle.response_complete:
                self.cycle.disconnected = True
            self.cycle.message_event.set()
        if self.flow is not None and self.flow.write_paused:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
        self._stop_keep_alive()
        self.parser = None
        self._tell_gone()
        self._let_go()  # of its requests, which hold it (see the module docstring)
        self.scope = self.headers = self.cycle = None  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._stop_keep_alive()
        if self.parser is None:  # dropped once the last request was read whole
            self.parser = request_parser(self)
        was_in_head, bare, trailers = self._in_head, self._bare_chunk, self._trailer_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refused:
                return  # a limit has answered the request from a callback (`body.StopParsing`)
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.transport.write(bad_request(msg, self.served.state.default_headers))
            self.transport.close()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._hand_over()
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
            self.parser = None

    # The parser's callbacks

    def on_message_begin(self) -> None:
        self._in_head = True  # a request's first byte: on a kept-alive connection, arm now
        self._head_bytes = 0
        self._began = True
        self._read_whole = self._bare_chunk = False
        self._trailer_bytes = 0
        if self._head_deadlines is None:
            self._arm()
        served = self.served
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {
            "type": "http",
            "asgi": {"version": served.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": served.root_path,
            "headers": self.headers,
            "state": served.app_state.copy(),
        }

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            self.headers.append((name, value))  # as read: made as uvicorn's all at once, below
        else:  # a trailer field: counted, never one of the request's headers (`body`)
            self._on_trailer(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = self._began = False
        if self._head_deadlines is not None:
            self._disarm()
        parser, scope, served = self.parser, self.scope, self.served
        assert parser is not None
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
        locate(scope, self.url, served.root_path)
        app = served.app
        limit = served.limit_concurrency
        if limit is not None and (len(served.connections) >= limit or len(served.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")

        cycle = RequestCycle(
            scope,
            self.transport,
            self.flow,
            self.loop,
            self,
            served.state.default_headers,
            self.access_log,
            self.expect_100_continue,
            http_version != "1.0" and parser.should_keep_alive(),
        )
        if method != b"HEAD":  # HEAD responses have no body
            self._offer(cycle, scope)
        existing, self.cycle = self.cycle, cycle
        if existing is None or existing.response_complete:
            self._run(cycle, app)
        else:  # pipelined: queued until the one before it is answered
            self.flow.pause_reading()
            if self.pipeline is None:
                self.pipeline = []
            self.pipeline.append((cycle, app))

    def on_message_complete(self) -> None:
        if self._body_deadlines is not None:
            self._disarm_body()
        parser, cycle = self.parser, self.cycle  # an upgrade's parser stays: it is paused
        assert parser is not None
        upgrade = parser.should_upgrade()
        self._read_whole = not upgrade
        self._bare_chunk = False
        if upgrade and self._should_upgrade():
            return  # handed over (`upgrade`): no request task was made
        assert cycle is not None  # made by the head (a CONNECT's head made none: refused)
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()

    # What the transport calls

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def _trace(self, message: str) -> None:
        prefix = f"{self.client[0]}:{self.client[1]:d} - " if self.client else ""
        self.logger.log(TRACE, "%s%s", prefix, message)


def protocol_class(
    header_timeout: float | None,
    max_head_bytes: int,
    body_timeout: float | None = BodyLimits.body_timeout,
    max_trailer_bytes: int = BodyLimits.max_trailer_bytes,
) -> type[Http1Protocol]:
    """An `Http1Protocol` with these limits, for `uvicorn.Config(http=...)`."""
    limits = {
        "header_timeout": header_timeout,
        "max_head_bytes": max_head_bytes,
        "body_timeout": body_timeout,
        "max_trailer_bytes": max_trailer_bytes,
    }
    return type("Http1Protocol", (Http1Protocol,), {**limits, "__slots__": ()})
