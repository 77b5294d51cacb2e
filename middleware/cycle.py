"""One request's trip through StreamGuard: its run, its response's start, the one timer.

The rules are the guard's (see `guard.py`); `Cycle` runs them for one request. Per chunk
(`relay.Relay`, its base) it stores the clock, scans for the first token until it has come,
advances the O(1) SSE line state, and hands the chunk to the server: nothing else. The
client side (request body, hearing the client leave) is `receiver.Receiver`; what is due
when is `deadlines`, the timer `timers`; the response's progress is a `phases.Phase`.
Telemetry, when on, runs the request with a subclass of this one
(`middleware.telemetry.observed`): this module knows nothing of it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

from middleware import timers, usage
from middleware.deadlines import KEEPALIVE, SEND, Expiry, Timeouts, expired, next_deadline
from middleware.dialects import select
from middleware.errors import (
    COMPLETED,
    SLOW_CLIENT,
    FirstTokenTimeout,
    IdleTimeout,
    MaxDuration,
    Outcome,
    ShuttingDown,
    StreamError,
    UpstreamError,
)
from middleware.offer import drop_slow_client, offer_of, take_offer
from middleware.phases import DONE, HEADERS, PLAIN, START
from middleware.receiver import Receiver
from middleware.registry import StreamRegistry
from middleware.relay import Relay
from middleware.sse import LineState, SSEScanner
from middleware.stream_response import (
    Inflater,
    error_response,
    guarded,
    stream_headers,
    terminal_event,
)
from middleware.types import ASGIApp, Message, Receive, Scope, Send
from middleware.usage import BODY_LIMIT

logger = logging.getLogger("sidestream")

LINE = LineState.LINE  # a module global, as the phases (see `phases.START`)
EXPIRED: dict[Expiry, type[StreamError]] = {
    Expiry.MAX_DURATION: MaxDuration,
    Expiry.FIRST_TOKEN: FirstTokenTimeout,
    Expiry.IDLE: IdleTimeout,
}


class Resumer(Protocol):
    """Resumable streams (`middleware.resume.Resume`): names an SSE stream as it starts,
    setting the cycle's `edit` and `resumable`."""

    def begin(self, cycle: Cycle, start: dict[str, Any]) -> None: ...


class Resumable(Protocol):
    """One resumable stream's state (`middleware.resume.producer.Producer`)."""

    def reader_left(self) -> bool:
        """The client left: True when the stream goes on (resume's grace), not cancelled."""

    def end(self) -> None:
        """The request has run (its outcome and error are set)."""

    @property
    def stream_id(self) -> str: ...

    @property
    def resumes(self) -> int:
        """Resume requests served so far."""

    @property
    def end_seen(self) -> bool:
        """A reader (the client, or one that resumed) has read the stream's end."""


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """What a cycle needs of its guard: the app, the timeouts, the stream types, the registry,
    resume (None: off)."""

    app: ASGIApp
    timeouts: Timeouts
    content_types: frozenset[bytes]
    registry: StreamRegistry
    usage: str = "pass"  # `usage.MODES`: ask OpenAI-style upstreams for usage ("force")
    resume: Resumer | None = None
    usage_body_limit: int = BODY_LIMIT  # request body bytes forced usage holds at most

    @property
    def forcing(self) -> tuple[str, int]:
        """What `usage.prepare` is given: the mode, and the body bytes it may hold."""
        return self.usage, self.usage_body_limit


class Cycle(Relay):
    """Per-request state. Created by StreamGuard.__call__, never shared between requests."""

    __slots__ = (
        "aborted_at",
        "cancelled_task",
        "ending",
        "error",
        "loop",
        "outcome",
        "resumable",
        "running",
        "scope",
        "settings",
        "sse",
        "started",
        "status",
        "stopped_at",
        "streaming",
        "task",
        "timer_context",
        "timer_due",
        "timer_slot",
        "timers",
    )

    def __init__(self, settings: GuardSettings, scope: Scope, receive: Receive, send: Send) -> None:
        self.settings = settings
        self.scope = scope
        receiver = Receiver(receive, self._client_left)
        server_nowait = take_offer(scope, self.send_nowait, receiver)
        self.started = now = monotonic()
        super().__init__(receiver, send, server_nowait, now)
        self.loop = loop = asyncio.get_running_loop()  # a getpid() call; current_task(loop) none
        task = asyncio.current_task(loop)
        assert task is not None, "StreamGuard runs inside a task"
        self.task = task
        self.running = False  # the app is running and may be cancelled
        self.streaming = False  # a guarded stream: SSE or another configured type
        self.sse = False
        # The one timer: a place in this loop's heap of waiting cycles (`middleware.timers`).
        self.timers = timers.for_loop(loop)
        self.timer_slot = timers.NOT_ARMED
        self.timer_due = 0.0
        self.outcome = COMPLETED
        self.cancelled_task = False
        # Read once at the request's end (telemetry, the access line).
        self.status = 0
        self.error: StreamError | None = None
        self.aborted_at: float | None = None  # a stop was decided (disconnect, timeout, drain)
        self.stopped_at: float | None = None  # the app has stopped
        self.resumable: Resumable | None = None  # resume on, an SSE stream
        self.ending: asyncio.Task[None] | None = None  # the end, written at the deadline

    # -- the request ------------------------------------------------------------------------

    async def run(self) -> None:
        settings, task = self.settings, self.task
        settings.registry.add(self)
        base = task.cancelling()
        # The timer's callbacks run in the request's context as it is now (telemetry's span
        # current), as a loop timer armed here would.
        self.timer_context = contextvars.copy_context()
        # Armed next turn, after the app's upstream request: before it, all is time to first token.
        self.loop.call_soon(self._arm_first)
        error: StreamError | None = None
        self.running = True
        try:
            receive: Receive = self.receiver.receive
            if (forcing := usage.prepare(self.scope, receive, *settings.forcing)) is not None:
                (receive, self.edit), forcing = await forcing, None  # not held while open
            await settings.app(self.scope, receive, self.send)
        except asyncio.CancelledError:
            if self.reason is None or (self.cancelled_task and task.uncancel() > base):
                if self.resumable is not None:
                    self.resumable.end()
                raise
        except StreamError as exc:
            error = exc
        except Exception as exc:
            if not self.streaming or self.phase is DONE:
                raise
            logger.exception("the application failed mid-stream", exc_info=exc)
            error = UpstreamError("the application failed mid-stream")
        else:
            if self.cancelled_task and task.cancelling() > base:
                task.uncancel()  # the app swallowed our cancellation and returned
        finally:
            self.running = False
            self.stopped_at = monotonic()
            self._stop_helpers()
            settings.registry.discard(self)
        reason = self.reason
        if isinstance(reason, StreamError):
            error = reason
        elif reason is not None:  # what the app raised on its way out (its upstream stopped)
            self.outcome = reason  # follows from the stop, and is not the stream's outcome
            error = None
        if self.ending is not None:
            await self.ending  # written already: `fail` below finds the stream DONE
        if error is not None:
            self.outcome = error.outcome
            self.error = error
            await fail(self, error)
        if self.resumable is not None:
            self.resumable.end()
        if self.outcome is SLOW_CLIENT and self.phase is not DONE:
            drop_slow_client(self.scope, self.settings.timeouts.send_timeout)

    async def refuse(self, error: StreamError) -> None:
        """Answer `error` (a 503 with `Retry-After`) without running the app: admission
        refused. The request still has an outcome, for telemetry to report."""
        self.outcome = error.outcome
        self.error = error
        self.stopped_at = monotonic()
        await fail(self, error)
        logger.debug("refused a request: %s", error.code)

    def shut_down(self) -> None:
        """Drain: end this request now with a retryable error (StreamRegistry.drain)."""
        self._abort(ShuttingDown())

    def _client_left(self) -> None:
        # In the request's context: the server may tell from a callback of its own.
        resumable = self.resumable
        if resumable is not None and self.timer_context.run(resumable.reader_left):
            return
        self._abort(Outcome.CLIENT_DISCONNECTED)

    def _abort(self, reason: StreamError | Outcome) -> None:
        if self.reason is None and self.running and self.phase is not DONE:
            self.reason = reason
            self.aborted_at = monotonic()
            stop = (offer_of(self.scope) or {}).get("stop")
            if stop is not None:
                stop()  # the app's upstream closed now, not once the cancellation reaches it
            if isinstance(reason, StreamError) and self.streaming and self.sending_since is None:
                # A stream's end at the deadline, not once the app unwinds: one blocked in a
                # worker thread (a prefill it cannot abandon) may take seconds. Its later
                # writes are dropped (`_send_other`); nothing else writes meanwhile.
                self.outcome, self.error = reason.outcome, reason  # as the end reports them
                self.ending = self.loop.create_task(fail(self, reason))
            # One loop turn later, so an app waiting in receive() hears http.disconnect first.
            self.loop.call_soon(self._cancel_app)

    def _cancel_app(self) -> None:
        if self.running:
            self.cancelled_task = True
            self.task.cancel()

    def _stop_helpers(self) -> None:
        self.timers.disarm(self)
        self.receiver.stop()
        if self.keepalive is not None and self.reason is SLOW_CLIENT:
            self.keepalive.cancel()

    # -- the response side ---------------------------------------------------------------------

    async def _send_other(self, message: Message) -> None:
        """Everything but a stream's body chunk: the response start, a plain response."""
        if self.phase is DONE and self.reason is not None:
            raise asyncio.CancelledError  # ended at a deadline: what the app sends is dropped
        if message["type"] == "http.response.start" and self.phase is START:
            await self._start(message)
            return
        if (
            self.phase is PLAIN
            and message["type"] == "http.response.body"
            and not message.get("more_body", False)
        ):
            self._enter(DONE)
        await self.downstream(message)

    async def _start(self, message: Message) -> None:
        headers = _listed(message.get("headers", ()))
        self.status = status = message["status"]
        if status >= 500:  # the app's (the upstream's) own failure, passed through
            self.outcome = Outcome.UPSTREAM_ERROR
        elif status == 429:
            self.outcome = Outcome.RATE_LIMITED
        kind = guarded(headers, status, self.scope.get("method"), self.settings.content_types)
        if kind is None:
            self._enter(PLAIN)
            self.timers.disarm(self)  # a plain response: no deadlines once it has begun
            await self.downstream(message)
            return
        media, encoding, names = kind  # the names lower-cased, read once: for the headers too
        self._enter(HEADERS)
        self.streaming = True
        self.sse = media == b"text/event-stream"
        if encoding:
            self.inflater = Inflater(encoding)
        if self.sse:
            self._start_sse()
        self.receiver.read_for_app()
        start: dict[str, Any] = dict(message)
        start["headers"] = stream_headers(headers, decode=bool(encoding), names=names)
        if self.sse and self.settings.resume is not None:
            self.settings.resume.begin(self, start)
        # No re-arm: what a start brings due (keep-alive, send) is a tick away or more, and the
        # timer armed at arrival fires within a tick of that and arms for what is due then.
        self.last_write = monotonic()
        await self.downstream(start)
        if self.server_nowait is None:  # a head held for a body byte (hypercorn): send it
            await self.downstream({"type": "http.response.body", "body": b"", "more_body": True})

    def _start_sse(self) -> None:
        """An SSE stream begins: scan it for its first token."""
        self.scanner = SSEScanner()
        self.dialect = select(self.scope.get("path", ""))

    # -- the one timer ---------------------------------------------------------------------------

    def _arm_first(self) -> None:
        # Deadlines on the cycle's clock, time.monotonic: uvloop's loop.time() moves in whole
        # milliseconds, too coarse for TTFT and inter-token gaps (see `timers.SLACK`).
        if self.running:
            self.timers.arm(self, next_deadline(self.settings.timeouts, self, self.started))

    def on_timer(self) -> None:
        """The timer fired (`middleware.timers`): whatever is due, then the next deadline."""
        if not self.running or self.phase is DONE or self.reason is not None:
            return
        timeouts, now = self.settings.timeouts, monotonic()
        due = expired(timeouts, self, now)
        if due is KEEPALIVE:
            # Only at a line boundary, and never twice at once; otherwise next time round.
            if self.keepalive is None and self.line_state <= LINE:
                self.keepalive = self.loop.create_task(self._write_keepalive(now))
        elif due is SEND:
            self._abort(SLOW_CLIENT)
            return
        elif due is not None:
            self._abort(EXPIRED[due]())
            return
        self.timers.arm(self, next_deadline(timeouts, self, now))


async def fail(cycle: Cycle, error: StreamError) -> None:
    """End `cycle` with `error`: before headers an error response, in a stream one terminal
    event, then the end. Run once the app stopped, or at the deadline itself (`_abort`)."""
    if cycle.phase is START:
        cycle.status = error.status
        retry_after = 1 if error.retryable else None
        start, body = error_response(error.status, error.json_body(), retry_after=retry_after)
        await cycle.downstream(start)
        await cycle.downstream(body)
        return
    if not cycle.streaming or cycle.phase is DONE or cycle.receiver.client_gone:
        return  # a plain response already under way: the server closes the connection
    if cycle.keepalive is not None:
        await asyncio.wait((cycle.keepalive,))
    dialect = cycle.dialect or select(cycle.scope.get("path", ""))
    data = terminal_event(dialect, error.error_object(), cycle.line_state, sse=cycle.sse)
    if cycle.edit is not None:  # the end goes through the edit too (resume stores it)
        data, cycle.edit = cycle.edit(data), None
    cycle._enter(DONE)
    try:
        async with asyncio.timeout(cycle.settings.timeouts.send_timeout):
            await cycle.downstream({"type": "http.response.body", "body": data, "more_body": False})
    except TimeoutError:
        cycle.outcome = Outcome.SLOW_CLIENT


def _listed(headers: Iterable[Any]) -> Sequence[Any]:
    """An app's response headers (any iterable, in ASGI) as a sequence: read more than once."""
    return headers if isinstance(headers, list | tuple) else list(headers)
