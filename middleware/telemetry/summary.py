"""What one stream came to: computed once at its end, read by every sink.

`Summary` turns a request's record and its cycle into the facts the sinks report — outcome,
status and error type, times (time to first token, duration, cancel latency), the gaps'
quantiles, token usage, model, response id and finish reasons, counts — so the span, the
metrics and the access line agree by construction and none of them recomputes another's
value. Pure computation: no clock read (the end time is given), no I/O; sealing the gaps is
the one change it makes (see `gaps.Gaps.seal`).

Usage and partial counts are summarised whatever the outcome: a cancelled stream reports the
tokens it relayed. `output_tokens` is the upstream's usage when the stream carried it, else
the content-carrying events counted (`tokens`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from middleware.errors import COMPLETED, UPSTREAM_ERROR, Outcome, StreamError
from middleware.telemetry import semconv
from middleware.telemetry.kinds import CALL, Kind, classify, is_genai

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from middleware.cycle import Resumable
    from middleware.dialects import Dialect, StreamStats
    from middleware.relaycore import Tally
    from middleware.telemetry.answer import Answer
    from middleware.telemetry.direct import DirectSpan
    from middleware.telemetry.gaps import Gaps

FAILURES = frozenset(
    {
        Outcome.IDLE_TIMEOUT,
        Outcome.FIRST_TOKEN_TIMEOUT,
        Outcome.MAX_DURATION,
        Outcome.UPSTREAM_ERROR,
        Outcome.SHUTDOWN,
    }
)
PROVIDERS = {
    "openai.chat": "openai",
    "openai.completions": "openai",
    "openai.responses": "openai",
    "anthropic": "anthropic",
    "tgi": "huggingface.tgi",
}
# By value: an Outcome hashes through a Python __hash__ (Enum's), its value as the str it is.
FAILURE_VALUES = frozenset(o.value for o in FAILURES)
_ERROR_REASONS = ("error",)
_REFUSED = frozenset({Outcome.REJECTED_OVERLOAD.value, Outcome.REJECTED_DRAINING.value})


class Cycle(Protocol):
    """What telemetry reads of a request's cycle once it has run (`observed.ObservedCycle`)."""

    outcome: Outcome
    status: int
    error: StreamError | None
    streaming: bool
    dialect: Dialect | None
    started: float
    first_token_at: float | None
    aborted_at: float | None
    stopped_at: float | None
    completed_at: float | None
    keepalives: int
    resumable: Resumable | None
    answer: Answer | None

    def stream_stats(self) -> StreamStats | None: ...


class TelemetryView(Protocol):
    """What a stream's end reads from its `Telemetry`."""

    @property
    def provider_name(self) -> str | None: ...
    @property
    def genai_names(self) -> semconv.GenAINames: ...
    @property
    def sinks(self) -> Sequence[Callable[[Summary], None]]: ...


class Record(Protocol):
    """What a stream's end reads from its record. `record.StreamRecord` is one; a protocol, not
    an import, because the record module imports the end (`finish`) and so this module."""

    @property
    def telemetry(self) -> TelemetryView: ...
    @property
    def t0(self) -> float: ...
    @property
    def gaps(self) -> Gaps: ...
    @property
    def tally(self) -> Tally: ...
    @property
    def request(self) -> Mapping[str, Any]: ...
    @property
    def server(self) -> Mapping[str, str | int]: ...
    @property
    def genai(self) -> Dialect | None: ...
    @property
    def text(self) -> list[str] | None: ...
    @property
    def span(self) -> Span | None: ...
    @property
    def direct(self) -> DirectSpan | None: ...
    @property
    def method(self) -> str: ...
    @property
    def call(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    def ns(self, at: float) -> int: ...


class Summary:
    """One stream's end, as the sinks report it (see the module docstring).

    `kind` is what the request was (`kinds`: a stream, a GenAI call, other traffic), and
    `genai` whether it is reported as a GenAI operation; `series` holds the GenAI attributes
    its metrics are keyed by (operation, provider, request model, server), empty unless
    `genai`; the span carries them too. Times are seconds on the cycle's monotonic clock (`end`,
    `first_token_at`, `completed_at`, `aborted_at`; `record.ns` turns them into wall-clock
    nanoseconds) or durations in seconds.
    """

    __slots__ = (
        "aborted_at",
        "bytes",
        "cancel_latency",
        "chunks",
        "completed_at",
        "dialect",
        "duration",
        "end",
        "end_seen",
        "error",
        "error_type",
        "failure",
        "finish_reasons",
        "first_token_at",
        "gap_max",
        "gaps",
        "genai",
        "input_tokens",
        "keepalives",
        "kind",
        "model",
        "operation",
        "outcome",
        "outcome_value",
        "output",
        "output_tokens",
        "p50",
        "p99",
        "record",
        "resumes",
        "series",
        "stats",
        "status",
        "stream_id",
        "streaming",
        "tokens",
        "tokens_per_second",
        "ttft",
        "usage_source",
    )

    def __init__(
        self, record: Record, cycle: Cycle, failure: BaseException | None, end: float
    ) -> None:
        self.record = record
        self.end = end
        outcome = cycle.outcome
        if isinstance(failure, asyncio.CancelledError):
            failure = None  # the server cancelled the request task: not the app's failure
        elif failure is not None and outcome is COMPLETED:
            outcome = UPSTREAM_ERROR
        self.failure = failure
        self.outcome = outcome
        status = self.status = cycle.status or (500 if failure is not None else 0)
        outcome_value: str = outcome._value_  # `.value` is an Enum property (a Python call)
        self.outcome_value = outcome_value
        error_type: str | None = None
        if outcome_value in _REFUSED:
            error_type = outcome_value
        elif outcome is UPSTREAM_ERROR and cycle.error is None and failure is None:
            error_type = str(status)  # the upstream's own 5xx, passed through
        elif outcome_value in FAILURE_VALUES:
            error_type = outcome_value
        elif failure is not None:
            error_type = type(failure).__qualname__
        elif status >= 500:
            error_type = str(status)
        self.error_type = error_type
        self.error: BaseException | None = cycle.error if cycle.error is not None else failure

        t0 = record.t0
        self.duration = end - t0
        first_token_at = self.first_token_at = cycle.first_token_at
        self.ttft = None if first_token_at is None else first_token_at - t0
        aborted_at = self.aborted_at = cycle.aborted_at
        self.completed_at = cycle.completed_at
        stopped_at = cycle.stopped_at
        self.cancel_latency = (
            None if aborted_at is None or stopped_at is None else max(0.0, stopped_at - aborted_at)
        )
        self.streaming = streaming = cycle.streaming
        answer = cycle.answer
        refused = outcome_value in _REFUSED
        call = record.call
        self.kind: Kind = classify(
            streamed=streaming,
            refused=refused,
            call=call,
            asked_stream=record.request.get(semconv.GEN_AI_REQUEST_STREAM) is True,
            answered=answer is not None,
            json=answer is not None and answer.json,
            status=status,
        )
        kind = self.kind
        # Counts of a stream; a response that is not one has its bytes only (none when the
        # app gave none): what does not apply is None.
        tally = record.tally
        self.chunks = tally.chunks if streaming else None
        self.keepalives = cycle.keepalives if streaming else None
        self.bytes = tally.body_bytes if streaming else None if answer is None else answer.size
        resumable = cycle.resumable  # resume on: the stream's id, resumes, whether its end was read
        self.stream_id = None if resumable is None else resumable.stream_id
        self.resumes = None if resumable is None else resumable.resumes
        self.end_seen = None if resumable is None else resumable.end_seen

        gaps: Gaps = record.gaps
        gaps.seal()  # the chunk times not folded yet: sorted, or into the buckets
        self.gaps = gaps
        self.p50, self.p99 = gaps.quantiles(0.5, 0.99)
        self.gap_max = gaps.max if gaps.count else None
        self.tokens_per_second = gaps.tokens_per_second()

        stats: StreamStats | None = cycle.stream_stats()
        self.finish_reasons: tuple[str, ...] = ()
        self.usage_source: str | None = None
        self.tokens = self.input_tokens = self.output_tokens = None
        if stats is None and kind is CALL and answer is not None:
            stats = answer.stats()  # what the body said: no chunks, so no count of them
            if stats is not None:
                self.input_tokens, self.output_tokens = stats.input_tokens, stats.output_tokens
                if stats.input_tokens is not None or stats.output_tokens is not None:
                    self.usage_source = "reported"
                self.finish_reasons = tuple(stats.finish_reasons)
        elif stats is not None:
            self.tokens = stats.tokens
            self.input_tokens = stats.input_tokens
            output = stats.output_tokens
            self.output_tokens = output if output is not None else stats.tokens
            # The server's own count, or the content-carrying chunks relayed (an early end
            # without continuous usage: no count came).
            self.usage_source = "reported" if output is not None else "counted"
            if outcome is COMPLETED:
                self.finish_reasons = tuple(stats.finish_reasons)
            else:
                self.finish_reasons = _ERROR_REASONS
        self.stats = stats

        dialect: Dialect | None = cycle.dialect or record.genai
        self.dialect = dialect
        # GenAI operations alone get GenAI names and metrics (`kinds`): not a CORS preflight
        # on a chat path, nor a model listing.
        self.genai = genai = is_genai(kind, streaming, call)
        model = self.model = record.request.get(semconv.GEN_AI_REQUEST_MODEL)
        series: dict[str, str | int] = {}
        self.operation: str | None = None
        if genai:
            operation = self.operation = dialect.operation if dialect is not None else "chat"
            telemetry = record.telemetry
            provider = telemetry.provider_name or PROVIDERS.get(
                dialect.name if dialect else "", "unknown"
            )
            series[semconv.GEN_AI_OPERATION_NAME] = operation
            series[telemetry.genai_names.provider] = provider
            if model is not None:
                series[semconv.GEN_AI_REQUEST_MODEL] = model
            series.update(record.server)
        self.series = series

        # With capture_content: the text a stream relayed (None without, and for a call).
        text = record.text
        self.output = None if text is None or stats is None or kind is CALL else "".join(text)
