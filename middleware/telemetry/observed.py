"""The telemetry-aware cycle: the one seam between the guard core and telemetry.

`Telemetry` hands the guard `cycle_class`, a subclass of `ObservedCycle` bound to it, and
the guard runs every request with it. The subclass keeps a `StreamRecord` from arrival,
runs the request with the record's span current, and finishes the record when the request
has run. Per chunk it counts what `Cycle` does not (chunks, bytes, tokens, their times).

The token path: once a stream's usual token chunk is learned (`Frame`, from
`Dialect.count_chunk`), a chunk that matches it is one token and one whole event, and is
counted by appending its time to the record's `gaps.times`: no scanner, no JSON. The relay's
core runs it (`RelayCore._account`; compiled where built) with the record's `tally`, which
this cycle hands the core and keeps the learned frame in (`Tally.frame`); the tally counts
the chunk, its bytes and its time, and folds `gaps` when it holds `TIMES_KEPT` times.
Every other chunk comes here, to `_relayed`, counted into the same tally, and goes through
`_observe` (the dialect's reads of usage, model, finish reason). The tokens on the token
path are added to `stats` only when someone asks (`stream_stats`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, ClassVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from middleware.cycle import Cycle, GuardSettings
from middleware.dialects import StreamStats, sniff
from middleware.errors import StreamError
from middleware.phases import PLAIN, START
from middleware.sse import LineState, advance
from middleware.telemetry.answer import Answer
from middleware.telemetry.finish import finish
from middleware.telemetry.record import StreamRecord
from middleware.types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from middleware.telemetry.pipeline import Pipeline

EVENT = LineState.EVENT  # the hot path compares against a module global, not a class attribute


class ObservedCycle(Cycle):
    """A `Cycle` with one request's telemetry; see the module docstring."""

    telemetry: ClassVar[Pipeline]  # set on the subclass `Telemetry.cycle_class` makes

    __slots__ = ("answer", "record", "stats", "times_counted")

    def __init__(self, settings: GuardSettings, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(settings, scope, receive, send)
        self.record = record = StreamRecord(self.telemetry, scope, self.started)
        if record.genai is not None:
            self.receiver.tap(record.tap)
        self.stats: StreamStats | None = None  # set for an SSE stream: every event observed
        # The tally's `frame`, the stream's token chunk once learned, is withheld while a read
        # has left the stream inside an event: a chunk that reaches it starts at a boundary.
        self.tally = record.tally
        # The times in `times` not added by the token path (by `_heard`, whose tokens are in
        # `stats` already, or counted by `stream_stats`): the rest are the token path's.
        self.times_counted = 0
        self.answer: Answer | None = None  # a response that is not a stream, as it passes

    # `run` and `refuse` hand back `_observed`'s coroutine rather than awaiting it in one of
    # their own: one coroutine frame less for every open stream to hold.

    def run(self) -> Coroutine[Any, Any, None]:
        """Run the request with its span current, then finish the record."""
        return self._observed(super().run())

    def refuse(self, error: StreamError) -> Coroutine[Any, Any, None]:
        """A request refused at admission is reported too (its outcome, the 503)."""
        return self._observed(super().refuse(error))

    async def _observed(self, work: Coroutine[Any, Any, None]) -> None:
        record = self.record
        span = record.span
        token = None if span is None else otel_context.attach(trace.set_span_in_context(span))
        failure: BaseException | None = None
        try:
            await work
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            try:
                finish(record, self, failure)
            except Exception:
                logging.getLogger("sidestream").exception("telemetry failed for a request")

    async def _send_other(self, message: Message) -> None:
        """A response that is not a stream is watched as it passes (`answer.Answer`): its
        size, whether it is JSON, and a GenAI call's usage. A stream's start passes as it is."""
        answer = self.answer
        if answer is None:
            starting = message["type"] == "http.response.start" and self.phase is START
            headers = message.get("headers", ())
            if starting and not isinstance(headers, list | tuple):  # read twice: here too
                message = {**message, "headers": list(headers)}
            await super()._send_other(message)
            if starting and self.phase is PLAIN:
                self.answer = Answer(message.get("headers", ()), read=self.record.call)
            return
        await super()._send_other(message)
        if message["type"] == "http.response.body":
            answer.took(message.get("body", b""))

    def _start_sse(self) -> None:
        super()._start_sse()
        self.stats = StreamStats()  # observe every event, not only up to the first token

    def _relayed(self, body: bytes, now: float) -> None:
        tally = self.record.tally
        tally.chunks += 1
        tally.body_bytes += len(body)
        stats = self.stats
        if stats is None:  # not SSE: nothing to observe
            Cycle._relayed(self, body, now)
            return
        self.last_chunk = now
        self._observe(body, now, stats)
        state = self.line_state = advance(self.line_state, body)
        tally.frame = stats.frame if state is EVENT else None

    def stream_stats(self) -> StreamStats | None:
        """The stream's stats (None unless SSE), with the tokens counted on the token path
        added in. Until then `stats` misses them; the dialects' own reads of `stats.events`
        (is this the first event?) are decided before any frame is learned."""
        stats = self.stats
        if stats is not None:
            tokens = self.record.gaps.added() - self.times_counted
            if tokens:
                stats.events += tokens
                stats.tokens += tokens
                self.times_counted += tokens
        return stats

    def _observe(self, body: bytes, now: float, stats: StreamStats) -> None:
        """Every event of a chunk off the token path goes through the dialect.

        A chunk of whole one-line `data: ...` events that starts at an event boundary (the
        usual LLM chunk, and the finish + usage + `[DONE]` group that ends a stream) skips the
        line-by-line scan (`SSEScanner.whole_events`, shared with the first-token scan). The
        token path's chunks never reach the scanner: they are whole events, so it stands at a
        boundary after them as before them.
        """
        record = self.record
        dialect = self.dialect
        if dialect is not None and self.line_state is EVENT and record.text is None:
            tokens = stats.tokens
            if dialect.count_chunk(body, stats):
                if stats.tokens != tokens:
                    self._heard(now)
                return
        scanner = self.scanner
        assert scanner is not None
        events = scanner.whole_events(body)
        if events is None:
            events = scanner.feed(body)
        tokens = stats.tokens
        for event in events:
            if dialect is None:
                dialect = self.dialect = sniff(event)
            dialect.observe(event, stats)
        if stats.tokens != tokens:
            self._heard(now)
            if record.text is not None:
                assert dialect is not None
                record.capture(events, dialect)

    def _heard(self, now: float) -> None:
        """`_observe` counted tokens in a chunk read at `now` (already in `stats`): the first
        token's time, the chunk's time, and that time marked as counted (`times_counted`)."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.record.gaps.add(now)
        self.times_counted += 1
