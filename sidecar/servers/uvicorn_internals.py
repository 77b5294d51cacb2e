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
- `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`: subclassed; its
  `data_received`, `on_message_begin`, `on_headers_complete`, `on_message_complete`,
  `connection_made`, `connection_lost` and `_unsupported_upgrade_warning` overridden; its
  `parser` (dropped between requests, made again as uvicorn makes it), `cycle`, `scope`,
  `loop` and `transport` read.
- `RequestResponseCycle`: `flow.write_paused`, `disconnected`, `response_complete`,
  `chunked_encoding` and `transport`, read per chunk by the `send_nowait` extension (here,
  and in its compiled twin, `sidecar/_core.c`'s `ChunkWriter`);
  `disconnected` set and `response_complete` read when the connection is lost (the
  extension's `on_disconnect`).
- the protocol's `pipeline`, `flow` (`FlowControl._is_writable_event`) and each cycle's
  `message_event`, replaced by lighter objects with the same methods (below).
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
from collections.abc import Generator
from typing import Any, Literal

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from middleware.types import SEND_NOWAIT, SendNowait
from sidecar.servers.listener import ExitEvent
from sidecar.speedups import core

CHECKED = ("0.55",)  # uvicorn major.minor releases these internals were read in

_PROTOCOL_HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "_unsupported_upgrade_warning",
)
_SERVER_HOOKS = ("capture_signals", "main_loop", "on_tick")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed uvicorn) one these internals were checked
    against, with every hook this module overrides still there?"""
    version = uvicorn.__version__ if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    hooks = [getattr(HttpToolsProtocol, name, None) for name in _PROTOCOL_HOOKS]
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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a request-head deadline, a head size cap and CONNECT 405.

    Configure by subclassing (see `protocol_class`): uvicorn builds one instance per
    connection with its own keyword arguments.
    """

    # Slots: uvicorn's own fields stay in the instance dict, and stay few enough for it to
    # share its keys with every other connection's (see the module docstring).
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

    header_timeout: float | None = 10.0
    max_head_bytes: int = 32768 + 8192

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipeline = Pipeline()  # type: ignore[assignment]  # uvicorn's methods, a list
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = True  # between requests or inside a request head
        self._head_bytes = 0
        self._refused = False
        self._began = False  # a request's first byte came and its head is not complete
        self._read_whole = False  # the last request was parsed to its end, nothing after it
        # The request whose extension takes an `on_disconnect` listener: the first one not
        # complete (a request pipelined behind it gets none, and its guard reads receive()).
        self._told_cycle: RequestResponseCycle | None = None
        self._told_offer: dict[object, object] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow._is_writable_event = LazyEvent(True)  # type: ignore[assignment]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        cycle, offer = self._told_cycle, self._told_offer
        if cycle is not None and offer is not None and not cycle.response_complete:
            cycle.disconnected = True  # uvicorn marks only the newest request's cycle
            listener = offer.get("on_disconnect")
            if callable(listener):
                listener()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self.parser is None:  # dropped once the last request was read whole
            self.parser = _request_parser(self)
        was_in_head = self._in_head
        super().data_received(data)
        if was_in_head and self._in_head and not self._refused:  # all of `data` was head
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                message = f"request head over {self.max_head_bytes} bytes"
                self._refuse(_answer(431, "request_header_fields_too_large", message))
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
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = self._began = False
        self._disarm()
        if self.parser.get_method() == b"CONNECT":
            allow = b"allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n"
            self._refuse(_answer(405, "method_not_allowed", "CONNECT is not proxied", allow))
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:
            return  # an upgrade: no request task was made for this head
        # Nothing waits on the new cycle's event yet: its task has not run.
        cycle.message_event = LazyEvent()  # type: ignore[assignment]
        if self.scope["method"] != "HEAD":  # HEAD responses have no body
            offer: dict[object, object] = {"send": send_nowait(cycle), "abort": self._drop}
            told = self._told_cycle
            if told is None or told.response_complete:
                offer["on_disconnect"] = None  # free for a listener (middleware.types)
                self._told_cycle, self._told_offer = cycle, offer
            self.scope["extensions"] = {SEND_NOWAIT: offer}

    def _drop(self) -> None:
        """The extension's `abort`: drop the client now. uvicorn logs an app that returns
        with its response incomplete as an error unless the client is gone: every request
        of the connection is marked gone (the one asking, and any pipelined behind it)."""
        for cycle in (self._told_cycle, self.cycle, *(queued for queued, _ in self.pipeline)):
            if cycle is not None:
                cycle.disconnected = True
        self.transport.close()

    def on_message_complete(self) -> None:
        # An upgrade's parser stays: it is paused, and what it makes of later bytes is its own.
        self._read_whole = not self.parser.should_upgrade()
        super().on_message_complete()

    def _unsupported_upgrade_warning(self) -> None:
        if not self._refused:  # CONNECT already answered: nothing to warn about
            super()._unsupported_upgrade_warning()

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


def _request_parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    """A request parser for `protocol`, as uvicorn makes one."""
    parser = httptools.HttpRequestParser(protocol)
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3
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
