"""One request's trip through StreamGuard: relay, deadlines, disconnect watcher, terminal event.

The guard's rules live in ../shared/design.md ("What StreamGuard does to a streaming
response"); this module is their per-request state machine. Per chunk the relay stores the
clock, advances the O(1) line state, scans for the first token while it has not come (or
for telemetry when asked), and awaits the server's `send`: nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic
from typing import TYPE_CHECKING, Any

from middleware.dialects import Dialect, StreamStats, select, sniff
from middleware.errors import (
    FirstTokenTimeout,
    IdleTimeout,
    MaxDuration,
    Outcome,
    ShuttingDown,
    StreamError,
    UpstreamError,
)
from middleware.framing import (
    DECODABLE,
    Inflater,
    error_response,
    media_type,
    stream_headers,
    terminal_event,
)
from middleware.sse import CR, LF, Event, LineState, SSEScanner, advance
from middleware.types import SEND_NOWAIT, Message, Receive, Scope, Send, SendNowait

if TYPE_CHECKING:
    from middleware.dialects import Frame
    from middleware.guard import StreamGuard
    from middleware.telemetry.record import StreamRecord

logger = logging.getLogger("sidestream")

BOM = b"\xef\xbb\xbf"
KEEPALIVE = b": keep-alive\n"
DISCONNECT: Message = {"type": "http.disconnect"}
TIMER_SLACK = 0.002  # seconds a deadline may fire late (uvloop's timers count whole ms)
EVENT = LineState.EVENT  # the hot path compares against a module global, not a class attribute
STASH_MESSAGES = 16  # request-body messages held for an app that streams before reading its body
TIMES_KEPT = 256  # telemetry's chunk times held per stream before `Gaps.fold`: 8 KB at most


class Cycle:
    """Per-request state. Created by StreamGuard.__call__, never shared between requests.

    Slotted: a relayed chunk reads and writes a dozen of these fields, and with slots they
    sit in the object itself instead of a separate values array, fewer cache lines away
    when the next token of this stream comes 20 ms and 49 other streams later: 5-10% less
    CPU per token in scenario a (`python -m bench.paced --together`, against the same code
    without slots, two runs).
    """

    times: list[float]  # see __init__

    __slots__ = (
        "aborted_at",
        "before_body",
        "body_done",
        "bytes",
        "cancelled_task",
        "chunks",
        "client_gone",
        "client_receive",
        "complete",
        "completed_at",
        "dialect",
        "downstream",
        "error",
        "first_token_at",
        "frame",
        "gone",
        "guard",
        "headers_sent",
        "inflater",
        "keepalive",
        "keepalives",
        "last_chunk",
        "last_write",
        "line_state",
        "loop",
        "outcome",
        "reason",
        "record",
        "running",
        "scanner",
        "scope",
        "sending_since",
        "server_nowait",
        "sse",
        "started",
        "stash",
        "stats",
        "status",
        "stopped_at",
        "streaming",
        "task",
        "timer",
        "times",
        "times_counted",
        "watcher",
        "wrote_before_body",
    )

    def __init__(self, guard: StreamGuard, scope: Scope, receive: Receive, send: Send) -> None:
        self.guard = guard
        self.scope = scope
        # The server's synchronous body write, if it offers one: the app gets the guard's
        # instead (its checks first, then the server's), never the server's own. Swapped in
        # the extension's own dict rather than in a copy of the scope: a copy costs ~1 KB
        # per open stream, and the server never reads the function back.
        self.server_nowait: SendNowait | None = None
        extensions = scope.get("extensions")
        if extensions and SEND_NOWAIT in extensions:
            offer = extensions[SEND_NOWAIT]
            self.server_nowait = offer["send"]
            offer["send"] = self.send_nowait
        self.client_receive = receive
        self.downstream = send
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "StreamGuard runs inside a task"
        self.task = task
        now = monotonic()
        self.started = self.last_chunk = self.last_write = now
        self.first_token_at: float | None = None
        self.sending_since: float | None = None
        self.running = False  # the app is running and may be cancelled
        self.headers_sent = False
        self.streaming = False  # a guarded stream: SSE or another configured type
        self.sse = False
        self.complete = False  # the final body message has been handed to the server
        self.body_done = False
        self.client_gone = False
        self.gone: asyncio.Event | None = None
        self.stash: asyncio.Queue[Message] | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.keepalive: asyncio.Task[None] | None = None
        self.reason: StreamError | Outcome | None = None
        self.line_state = LineState.EVENT
        self.scanner: SSEScanner | None = None
        self.dialect: Dialect | None = None
        self.stats: StreamStats | None = None
        # Telemetry's token path (see `_relayed`): the stream's frame once learned, and
        # `times`, the record's chunk times (set with the stats: read only once a frame is
        # learned, so never unset then). A token on that path is only its time appended: the
        # times not in `times_counted` (those `_observe` added, whose tokens are in `stats`
        # already, and those `stream_stats` has counted) are its tokens.
        self.frame: Frame | None = None
        self.times_counted = 0
        self.inflater: Inflater | None = None
        self.before_body = True  # no body byte relayed yet
        self.wrote_before_body = False
        self.chunks = self.bytes = self.keepalives = 0
        self.outcome = Outcome.COMPLETED
        self.cancelled_task = False
        # For telemetry; stamped once per request, read at its end.
        self.status = 0
        self.error: StreamError | None = None
        self.aborted_at: float | None = None  # a stop was decided (disconnect, timeout, drain)
        self.stopped_at: float | None = None  # the app has stopped
        self.completed_at: float | None = None  # the app handed over its final body message
        telemetry = guard.telemetry
        self.record: StreamRecord | None = None if telemetry is None else telemetry.record(self)

    # -- the request ------------------------------------------------------------------------

    async def run(self) -> None:
        guard, task = self.guard, self.task
        guard.registry.add(self)
        base = task.cancelling()
        self._arm(self._next_deadline(self.started))
        error: StreamError | None = None
        self.running = True
        try:
            await guard.app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            if self.reason is None or (self.cancelled_task and task.uncancel() > base):
                raise
        except StreamError as exc:
            error = exc
        except Exception as exc:
            if not self.streaming or self.complete:
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
            guard.registry.discard(self)
        reason = self.reason
        if isinstance(reason, StreamError):
            error = reason
        elif reason is not None:
            self.outcome = reason
        if error is not None:
            self.outcome = error.outcome
            self.error = error
            await self._fail(error)

    def shut_down(self) -> None:
        """Drain: end this request now with a retryable error (StreamRegistry.drain)."""
        self._abort(ShuttingDown())

    def _abort(self, reason: StreamError | Outcome) -> None:
        if self.reason is None and self.running and not self.complete:
            self.reason = reason
            self.aborted_at = monotonic()
            # One loop turn later, so an app waiting in receive() hears http.disconnect first.
            self.loop.call_soon(self._cancel_app)

    def _cancel_app(self) -> None:
        if self.running:
            self.cancelled_task = True
            self.task.cancel()

    def _stop_helpers(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.watcher is not None:
            self.watcher.cancel()
        if self.keepalive is not None and self.reason is Outcome.SLOW_CLIENT:
            self.keepalive.cancel()

    async def _fail(self, error: StreamError) -> None:
        if not self.headers_sent:
            self.status = error.status
            retry_after = 1 if error.retryable else None
            start, body = error_response(error.status, error.json_body(), retry_after=retry_after)
            await self.downstream(start)
            await self.downstream(body)
            return
        if not self.streaming or self.complete or self.client_gone:
            return  # a plain response already under way: the server closes the connection
        if self.keepalive is not None:
            await asyncio.wait((self.keepalive,))
        dialect = self.dialect or select(self.scope.get("path", ""))
        data = terminal_event(dialect, error.error_object(), self.line_state, sse=self.sse)
        self.complete = True
        try:
            async with asyncio.timeout(self.guard.send_timeout):
                await self.downstream(
                    {"type": "http.response.body", "body": data, "more_body": False}
                )
        except TimeoutError:
            self.outcome = Outcome.SLOW_CLIENT

    # -- the client side: request body and disconnects ---------------------------------------

    async def receive(self) -> Message:
        stash = self.stash
        if stash is not None:
            if self.client_gone and stash.empty():
                return DISCONNECT
            return await stash.get()
        if self.body_done:
            if not self.client_gone:
                if self.gone is None:
                    self.gone = asyncio.Event()
                await self.gone.wait()
            return DISCONNECT
        message = await self.client_receive()
        if message["type"] == "http.request":
            if not message.get("more_body", False):
                self.body_done = True
                self._watch()
        elif message["type"] == "http.disconnect":
            self.body_done = True
            self._client_left()
        return message

    def _watch(self) -> None:
        if self.watcher is None and not self.complete and not self.client_gone:
            self.watcher = self.loop.create_task(self._watch_client())

    async def _watch_client(self) -> None:
        """The one reader of the server's `receive` once the request body is in."""
        receive = self.client_receive
        while True:
            message = await receive()
            stash = self.stash
            if message["type"] == "http.disconnect":
                self._client_left()
                if stash is not None:
                    await stash.put(message)
                return
            if stash is not None:
                await stash.put(message)
                if not message.get("more_body", False):
                    self.body_done = True

    def _client_left(self) -> None:
        self.client_gone = True
        if self.gone is not None:
            self.gone.set()
        self._abort(Outcome.CLIENT_DISCONNECTED)

    # -- the response side ---------------------------------------------------------------------

    async def _send_other(self, message: Message) -> None:
        if self.streaming:
            await self.downstream(message)
            return
        if message["type"] == "http.response.start":
            await self._start(message)
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.downstream(message)

    async def _start(self, message: Message) -> None:
        headers = message.get("headers", ())
        kind, encoding = media_type(headers)
        self.headers_sent = True
        self.status = status = message["status"]
        if (
            kind not in self.guard.content_types
            or (encoding and encoding not in DECODABLE)
            or status in (204, 304)
            or self.scope.get("method") == "HEAD"
        ):
            if self.timer is not None:  # a plain response: no deadlines once it has begun
                self.timer.cancel()
                self.timer = None
            await self.downstream(message)
            return
        self.streaming = True
        self.sse = kind == b"text/event-stream"
        if encoding:
            self.inflater = Inflater(encoding)
        if self.sse:
            self.scanner = SSEScanner()
            record = self.record
            self.dialect = select(self.scope.get("path", "")) if record is None else record.genai
            if record is not None:
                self.stats = StreamStats()  # observe every event, not only up to the first token
                self.times = record.gaps.times
        if not self.body_done and self.watcher is None:
            # The app streams before it has read the request body (a GET handler that never
            # calls receive): the watcher reads it for the app and hands it over.
            self.stash = asyncio.Queue(STASH_MESSAGES)
            self._watch()
        start: dict[str, Any] = dict(message)
        start["headers"] = stream_headers(headers, decode=bool(encoding))
        self.last_write = now = monotonic()
        self._rearm(now)
        await self.downstream(start)
        # Servers that hold headers until the first body byte (hypercorn) send them now.
        await self.downstream({"type": "http.response.body", "body": b"", "more_body": True})

    async def send(self, message: Message) -> None:
        """The app's `send`. A stream's body chunk is relayed here, not in a coroutine helper:
        a coroutine call per chunk is measurable (the accounting, a plain call, is shared
        with `send_nowait`)."""
        if not self.streaming or message["type"] != "http.response.body":
            await self._send_other(message)
            return
        if self.reason is not None:
            # Stopped already. A server that drops writes to a gone client never suspends in
            # send(), so the pending cancellation could not reach an app that sends in a loop.
            raise asyncio.CancelledError
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self.inflater is not None:
            body = self.inflater.decompress(body) + (b"" if more else self.inflater.flush())
            message = {"type": "http.response.body", "body": body, "more_body": more}
        now = monotonic()
        if body:
            if self.before_body:
                self.before_body = False
                if self.wrote_before_body and body.startswith(BOM):
                    # A BOM is only a BOM at the start of the stream; a keep-alive went first.
                    body = body[3:]
                    message = {"type": "http.response.body", "body": body, "more_body": more}
            self._relayed(body, now)
        if not more:
            self.complete = True
            self.completed_at = now
        if self.keepalive is not None:
            await asyncio.wait((self.keepalive,))
        self.sending_since = self.last_write = now
        try:
            await self.downstream(message)
        finally:
            self.sending_since = None

    def send_nowait(self, body: bytes) -> bool:
        """The `SEND_NOWAIT` extension: relay one more stream chunk now, or refuse (False)
        and let the app `send` it. Refused whenever `send` would do more than write: before
        the first body byte (BOM), while a `send` or a keep-alive is under way (its bytes
        go first), with an inflater, once stopped, and whenever the server itself refuses
        (flow control)."""
        if (
            not self.streaming
            or self.before_body
            or self.reason is not None
            or self.complete
            or self.sending_since is not None
            or self.keepalive is not None
            or self.inflater is not None
            or self.server_nowait is None
            or not self.server_nowait(body)
        ):
            return False
        self.last_write = now = monotonic()
        self._relayed(body, now)
        return True

    def _relayed(self, body: bytes, now: float) -> None:
        """Account for a body chunk given to the server (by `send` or `send_nowait`): the
        idle clock, the counts, the first token or telemetry, the SSE line state."""
        self.last_chunk = now
        self.chunks += 1
        self.bytes += len(body)
        stats = self.stats
        if stats is not None:
            # Telemetry on. The usual token chunk, once the stream's frame is known (learned by
            # count_chunk, never with content capture on), is counted and timed right here:
            # the frame's check and the append `Gaps.add` makes (its count is the time: see
            # `times_counted`), no scanner, no JSON.
            # Everything it touches hangs off this object, not off the stats, record and gaps:
            # three fewer cache lines per token, fetched again after 49 other streams' tokens.
            # `frame` is None while a read has left the stream inside an event (set below), so
            # a chunk that reaches the check starts at an event boundary.
            frame = self.frame
            if frame is not None:
                # `Frame.matches`' usual case written out first: a call costs as much. (An
                # `if`, not a boolean expression: CPython specializes the int compare there.)
                if not frame.varies:
                    rest = body.removeprefix(frame.prefix)
                    content = rest.removesuffix(frame.suffix)
                    if (
                        rest is not body
                        and content is not rest
                        and content
                        and content[0] != 34
                        and LF not in content
                    ):
                        times = self.times
                        times.append(now)
                        if len(times) >= TIMES_KEPT:
                            self._fold()
                        return  # one whole event, as checked: the line state stays EVENT
                if frame.matches(body):  # the other tails (and the usual case, again)
                    times = self.times  # `Gaps.add` inline, as above: a call per token
                    times.append(now)
                    if len(times) >= TIMES_KEPT:
                        self._fold()
                    return
            self._observe(body, now, stats)
            # The line-state rule below, here too so that the frame follows it; written twice
            # to keep the telemetry-off path free of telemetry's checks.
            state = EVENT if body.endswith(b"\n\n") else advance(self.line_state, body)
            self.line_state = state
            self.frame = stats.frame if state is EVENT else None
            return
        if self.scanner is not None:
            self._scan(body, now)
        elif self.first_token_at is None:
            self.first_token_at = now
        # The usual chunk ends an event: the automaton's first rule, without the call.
        self.line_state = EVENT if body.endswith(b"\n\n") else advance(self.line_state, body)

    def _fold(self) -> None:
        """The token path's chunk times reached TIMES_KEPT: fold them into the gaps."""
        assert self.record is not None
        self.record.gaps.fold()

    def stream_stats(self) -> StreamStats | None:
        """The stream's stats (None without telemetry or SSE), with the tokens counted on the
        frame path added in. Until then `stats` misses them; the dialects' own reads of
        `stats.events` (is this the first event?) are decided before any frame is learned."""
        stats, record = self.stats, self.record
        if stats is not None and record is not None:
            tokens = record.gaps.added() - self.times_counted
            if tokens:
                stats.events += tokens
                stats.tokens += tokens
                self.times_counted += tokens
        return stats

    def _scan(self, body: bytes, now: float) -> None:
        assert self.scanner is not None
        events = self.scanner.feed(body)
        dialect = self.dialect
        for event in events:
            if dialect is None:
                dialect = self.dialect = sniff(event)
            if dialect.is_token(event):
                self.first_token_at = now
                self.scanner = None  # nothing more to learn per chunk
                return

    def _observe(self, body: bytes, now: float, stats: StreamStats) -> None:
        """Telemetry on: every event goes through the dialect, the record hears of tokens.

        A chunk of whole one-line `data: ...` events that starts at an event boundary (the
        usual LLM chunk, and the finish + usage + `[DONE]` group that ends a stream) skips the
        scanner: at a boundary the scanner holds nothing, and it holds nothing after such a
        chunk either, so splitting it here is exact and saves the scanner's Python per line.
        """
        record = self.record
        assert record is not None
        dialect = self.dialect
        if dialect is not None and self.line_state is EVENT and record.text is None:
            tokens = stats.tokens
            if dialect.count_chunk(body, stats):
                if stats.tokens != tokens:
                    self._heard(record, now)
                return
        parts = None
        if (
            dialect is not None
            and self.line_state is EVENT
            and body.startswith(b"data: ")
            and body.endswith(b"\n\n")
            and CR not in body
        ):
            parts = body[6:-2].split(b"\n\ndata: ")
            if body.count(LF) != 2 * len(parts):  # a line of another field, a multi-line data
                parts = None
        if parts is not None:
            events = [
                Event("message", part.decode("utf-8", "replace"), None, None) for part in parts
            ]
        else:
            assert self.scanner is not None
            events = self.scanner.feed(body)
        tokens = stats.tokens
        for event in events:
            if dialect is None:
                dialect = self.dialect = sniff(event)
            dialect.observe(event, stats)
        if stats.tokens != tokens:
            self._heard(record, now)
            if record.text is not None:
                assert dialect is not None
                record.capture(events, dialect)

    def _heard(self, record: StreamRecord, now: float) -> None:
        """`_observe` counted tokens in a chunk read at `now` (already in `stats`): the first
        token's time, the chunk's time, and that time marked as counted (`times_counted`)."""
        if self.first_token_at is None:
            self.first_token_at = now
        record.gaps.add(now)
        self.times_counted += 1

    # -- the one timer ---------------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        # The cycle's clock is time.monotonic: uvloop's loop.time() moves in whole milliseconds,
        # too coarse for TTFT and inter-token gaps. The timer only needs to be on time to a
        # millisecond or two; the slack keeps uvloop's rounding from firing it just early.
        self.timer = self.loop.call_later(
            max(0.0, when - monotonic()) + TIMER_SLACK, self._on_timer
        )

    def _rearm(self, now: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self._arm(self._next_deadline(now))

    def _next_deadline(self, now: float) -> float:
        """The earliest moment something may be due.

        Chunks move deadlines without touching the timer, so it also fires at least every
        `guard.tick` (the shortest interval configured): a send or a first token that starts
        a new deadline is seen by the timer before that deadline can pass.
        """
        guard = self.guard
        when = now + guard.tick
        if guard.max_duration is not None:
            when = min(when, self.started + guard.max_duration)
        if self.first_token_at is None:
            if guard.first_token_timeout is not None:
                when = min(when, self.started + guard.first_token_timeout)
        elif guard.idle_timeout is not None:
            when = min(when, self.last_chunk + guard.idle_timeout)
        if self.sending_since is not None and guard.send_timeout is not None:
            when = min(when, self.sending_since + guard.send_timeout)
        if self.sse and guard.keepalive_interval is not None:
            due = self.last_write + guard.keepalive_interval
            when = min(when, due if due > now else now + guard.keepalive_interval)
        return when

    def _on_timer(self) -> None:
        self.timer = None
        if not self.running or self.complete or self.reason is not None:
            return
        guard, now = self.guard, monotonic()
        if guard.max_duration is not None and now >= self.started + guard.max_duration:
            self._abort(MaxDuration())
            return
        if self.first_token_at is None:
            if (
                guard.first_token_timeout is not None
                and now >= self.started + guard.first_token_timeout
            ):
                self._abort(FirstTokenTimeout())
                return
        elif guard.idle_timeout is not None and now >= self.last_chunk + guard.idle_timeout:
            self._abort(IdleTimeout())
            return
        if self.sending_since is not None:
            if guard.send_timeout is not None and now >= self.sending_since + guard.send_timeout:
                self._abort(Outcome.SLOW_CLIENT)
                return
        elif (
            self.sse
            and guard.keepalive_interval is not None
            and self.keepalive is None
            and now >= self.last_write + guard.keepalive_interval
            and self.line_state <= LineState.LINE
        ):
            self.keepalive = self.loop.create_task(self._write_keepalive(now))
        self._arm(self._next_deadline(now))

    async def _write_keepalive(self, now: float) -> None:
        self.sending_since = now
        if self.before_body:
            self.wrote_before_body = True
        try:
            await self.downstream(
                {"type": "http.response.body", "body": KEEPALIVE, "more_body": True}
            )
            self.keepalives += 1
        finally:
            self.sending_since = None
            self.last_write = now
            self.keepalive = None
