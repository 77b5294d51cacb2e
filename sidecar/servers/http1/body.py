"""The traffic protocol's request-body limits (`BodyLimits`): a deadline for the whole body,
and a cap on its trailers, which are never merged into the request's headers.

uvicorn's own protocol reads a request body for as long as the client cares to trickle it,
and appends the trailer fields of a chunked body to the request's headers, as many and as large as they
come, for as long as they come: a client holds a `--max-streams` slot with one body byte
now and then, and a trailer that arrives before the app reads the headers (in the head's
packet, or while forced usage reads a chat body) reaches the upstream as a header. So:

- a request body, its trailers included, must be complete within `body_timeout` seconds
  of the end of its head (nginx's `client_body_timeout` counts per read; this one is for
  the whole body, so a trickle cannot renew it); past it: 408 if no response has started,
  else the connection is just closed. Time in which the server itself holds the body back
  (the app has not read what came, the request waits behind a pipelined one, or a client
  that sent `Expect: 100-continue` has not been asked for the body yet) is the server's,
  not the client's: a deadline that falls then is set again;
- trailer fields are counted against `max_trailer_bytes` (`--max-header-bytes`) and
  dropped: the proxy forwards no request trailers (it frames the upstream body itself,
  without any; an app that needs them is not one the sidecar fronts). Past the cap: 431 if
  no response has started, else a close. A trailer field is held in the parser only up to the cap plus one
  read: what comes after the last chunk is counted read by read, not only once a field is
  whole.

The answers are written straight to the transport, as the head's (`limits`), after the
request is marked gone: its app hears `http.disconnect`, and whatever it sends is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httptools

from sidecar.servers.http1.cycle import RequestCycle
from sidecar.servers.http1.events import HIGH_WATER_LIMIT, Flow
from sidecar.servers.http1.limits import BodyDeadlines, HeadLimits, answer


class StopParsing(Exception):  # not an error: a limit has answered already
    """Raised from a parser callback once a limit has answered the request: the parser stops
    there, and the connection is closing."""


class BodyLimits(HeadLimits):
    """The request-body deadline and trailer cap (see the module docstring): armed, counted
    and checked from the protocol's callbacks."""

    __slots__ = ("_bare_chunk", "_body_deadlines", "_read_whole", "_trailer_bytes")

    body_timeout: float | None = 60.0
    max_trailer_bytes: int = 32768
    # The protocol's fields and method this class reads.
    cycle: RequestCycle | None  # the request being read
    parser: httptools.HttpRequestParser | None
    pipeline: list[tuple[RequestCycle, Any]] | None
    flow: Flow
    _read_whole: bool
    # The class's body deadlines (one per listener class and loop), made at the first body
    # that is not whole when its head is.
    _body_deadline_set: BodyDeadlines | None = None
    _body_deadlines: BodyDeadlines | None  # where this connection's body deadline is set
    _trailer_bytes: int  # of the request being read
    _bare_chunk: bool  # a chunk's header was read and no body byte since: the last chunk's
    _should_upgrade: Callable[[], bool]

    def on_chunk_header(self) -> None:
        self._bare_chunk = True  # cleared by the chunk's data, unless it is the last chunk

    def on_body(self, body: bytes) -> None:
        """A piece of the request's body, for its app; and the chunk read last is not the
        last one."""
        self._bare_chunk = False
        cycle, parser = self.cycle, self.parser
        assert parser is not None
        if parser.should_upgrade() and self._should_upgrade():
            return  # handed over: the WebSocket protocol reads what follows
        assert cycle is not None  # made by the head
        if cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def _on_trailer(self, name: bytes, value: bytes) -> None:
        """A whole trailer field (from the parser): counted, and dropped."""
        if self._count_trailer(len(name) + len(value) + 4):
            raise StopParsing

    def _count_trailer(self, size: int) -> bool:
        """`size` more bytes of the request's trailers; past the cap, 431 (True: refused)."""
        self._trailer_bytes += size
        if self._trailer_bytes > self.max_trailer_bytes and not self._refused:
            message = f"request trailers over {self.max_trailer_bytes} bytes"
            self._refuse_request(431, "request_header_fields_too_large", message)
        return self._refused

    def _arm_body(self) -> None:
        if self.body_timeout is None:
            return
        deadlines = self._body_deadline_set
        if deadlines is None or deadlines.loop is not self.loop:
            deadlines = BodyDeadlines(self.loop, self.body_timeout)
            type(self)._body_deadline_set = deadlines
        deadlines.arm(self)
        self._body_deadlines = deadlines

    def _disarm_body(self) -> None:
        if self._body_deadlines is not None:
            self._body_deadlines.disarm(self)
            self._body_deadlines = None

    def _body_timed_out(self) -> None:
        self._body_deadlines = None
        if self._read_whole or self._refused or self.transport.is_closing():
            return
        if self.flow.read_paused or (
            self.cycle is not None and self.cycle.waiting_for_100_continue
        ):
            self._arm_body()  # the server holds the body back: the wait is not the client's
            return
        message = f"request body not complete within {self.body_timeout} s"
        self._refuse_request(408, "request_timeout", message)

    def _refuse_request(self, status: int, code: str, message: str) -> None:
        """Answer `status` and close, for a request whose app may be running: the answer is
        written only if no response is under way on the connection (none started for this
        request, none before it still being written), else the connection is just closed."""
        self._disarm_body()
        cycle = self.cycle
        started = cycle is not None and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # what its app sends now is dropped
            cycle.message_event.set()  # and a receive() it waits in hears http.disconnect
        if started or self.pipeline:
            self._refused = True
            self.transport.close()
        else:
            self._refuse(answer(status, code, message))
