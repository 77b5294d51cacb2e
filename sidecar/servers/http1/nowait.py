"""The `sidestream.send_nowait` extension (see `middleware.types`): the protocol's part,
which offers it in each request's scope (`NowaitOffer`), and the write itself, plain
(`send_nowait`) or compiled (`sidecar/_core.c`'s `ChunkWriter`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, Protocol

from middleware.types import SEND_NOWAIT, Scope, SendNowait
from sidecar.servers.http1.events import Flow
from sidecar.servers.uvloop_internals import direct_fd
from sidecar.speedups import core


class Answering(Protocol):
    """What the extension reads and marks of a request's cycle (`cycle.RequestCycle`, which
    imports this module: named here by what it holds)."""

    scope: Scope
    transport: asyncio.Transport
    flow: Flow
    disconnected: bool
    response_complete: bool
    chunked_encoding: bool | None


class NowaitOffer:
    """The `sidestream.send_nowait` extension offered in a request's scope (see
    `middleware.types`): its `send` (`send_nowait`), its `abort`, and for the first request
    of the connection not yet complete an `on_disconnect` slot, called when the client goes.
    """

    # Its two fields are slots of the protocol's: a second base with slots of its own would
    # conflict with the limits' (`body.BodyLimits`) in the protocol's layout.
    __slots__ = ()

    cycle: Answering | None
    pipeline: list[tuple[Any, Any]] | None  # (cycle, app) of each request waiting its turn
    transport: asyncio.Transport
    # The request whose extension takes an `on_disconnect` listener: the first one not
    # complete (a request pipelined behind it gets none, and its guard reads receive()).
    _told_cycle: Answering | None
    _told_offer: dict[object, object] | None

    def _offer(self, cycle: Answering, scope: Scope) -> None:
        offer: dict[object, object] = {"send": send_nowait(cycle), "abort": self._drop}
        told = self._told_cycle
        if told is None or told.response_complete:
            offer["on_disconnect"] = None  # free for a listener (middleware.types)
            self._told_cycle, self._told_offer = cycle, offer  # type: ignore[misc]
        scope["extensions"] = {SEND_NOWAIT: offer}

    def _tell_gone(self) -> None:
        """The connection is lost: the told request, if not complete, is marked so (the
        connection's own `connection_lost` marks only the newest request's) and its
        listener called."""
        cycle, offer = self._told_cycle, self._told_offer
        if cycle is not None and offer is not None and not cycle.response_complete:
            cycle.disconnected = True
            listener = offer.get("on_disconnect")
            if callable(listener):
                listener()

    def _let_go(self) -> None:
        """The connection is lost: it lets go of its requests, whose extensions hold it
        (`abort`). A request pipelined and never started has its extension emptied here, as
        `withdraw` empties the others' once their app returns."""
        for queued, _ in self.pipeline or ():
            withdraw(queued.scope)
        self.pipeline = None  # type: ignore[misc]  # a slot of the protocol's
        self._told_cycle = self._told_offer = None  # type: ignore[misc]

    def _drop(self) -> None:
        """The extension's `abort`: drop the client now. The cycle logs an app that returns
        with its response incomplete as an error unless the client is gone: every request
        of the connection is marked gone (the one asking, and any pipelined behind it)."""
        cycle: Answering | None
        for cycle in (self._told_cycle, self.cycle, *(queued for queued, _ in self.pipeline or ())):
            if cycle is not None:
                cycle.disconnected = True
        self.transport.close()


def withdraw(scope: Scope) -> None:
    """The request's app has returned: its extension drops what it holds. The app put its
    own functions in it (the guard's `send`, its receiver's `on_disconnect`), which hold the
    app's objects, which hold the request's cycle, whose scope holds the extension: without
    this, a request's objects wait for the cyclic collector."""
    offer = scope.get("extensions", {}).get(SEND_NOWAIT)
    if offer is not None:
        offer.clear()


def send_nowait(cycle: Answering) -> SendNowait:
    """The `SEND_NOWAIT` extension for one request: a chunked body write straight to the
    transport, what the cycle's `send` does for such a message, when nothing needs waiting for.
    Where the transport allows it (`uvloop_internals.direct_fd`), the chunk goes to the
    socket itself while the transport holds no bytes, and only what the socket did not take
    goes through the transport. Compiled where built: `sidecar/_core.c`'s `ChunkWriter`,
    this closure line for line."""
    # The descriptor is looked up at the first write that could use it, not here: asking
    # uvloop's transport for its socket costs a system call, and this runs on the way to the
    # stream's first token, which `send` writes (the head is held for it: `cycle`).
    fd_of: Callable[[asyncio.BaseTransport], int | None] | None = direct_fd
    if core is not None:
        writer: SendNowait = core.ChunkWriter(cycle, fd_of)
        return writer

    transport = cycle.transport  # the connection's: fixed for the cycle
    flow, write = cycle.flow, transport.write
    fd: int | None = None

    def send_nowait(body: bytes) -> bool:
        nonlocal fd, fd_of
        # `chunked_encoding` is None until the response has started, and True only for a
        # chunked body (the head's choice when no Content-Length was given).
        if (
            flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or not cycle.chunked_encoding
        ):
            return False
        framed = b"%x\r\n%b\r\n" % (len(body), body)
        if fd_of is not None:
            fd, fd_of = fd_of(transport), None
        if fd is not None and not transport.is_closing() and not transport.get_write_buffer_size():
            try:
                sent = os.write(fd, framed)
            except OSError:  # EAGAIN, or an error the transport's write meets again and reports
                sent = 0
            if sent == len(framed):
                return True
            framed = framed[sent:]
        write(framed)
        return True

    return send_nowait
