"""The span sink: a stream's attributes, events and status on its span, and the span's end.

The span was started at request arrival (`record.StreamRecord`): a direct span
(`direct.DirectSpans`, ended here in one call with everything at once) or an SDK span
(its attributes set, events added and status set through the SDK's `Span` API, then ended).
The attributes are written in one fixed order, the same for both kinds, so an exported span
is the same bytes from stream to stream of the same shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Status, StatusCode

from middleware.errors import Outcome
from middleware.telemetry import semconv
from middleware.telemetry.content import output_messages
from middleware.telemetry.direct import exception_event

if TYPE_CHECKING:
    from middleware.telemetry.direct import DirectSpans
    from middleware.telemetry.summary import Summary

_UNSET = Status(StatusCode.UNSET)


class SpanSink:
    """Ends each stream's span; `spans` are the direct spans, when they are used."""

    name = "span"

    def __init__(self, spans: DirectSpans | None) -> None:
        self.spans = spans

    def emit(self, summary: Summary) -> None:
        record = summary.record
        span = record.span
        if span is None:  # no spans configured, or none made for this request
            return
        attrs = attributes(summary)
        name = record.method
        if summary.genai:
            operation = summary.operation
            model = summary.model
            name = f"{operation} {model}" if model else str(operation)
        events = []
        if summary.first_token_at is not None:
            events.append((semconv.EVENT_FIRST_CHUNK, record.ns(summary.first_token_at)))
        if summary.streaming and summary.completed_at is not None:
            events.append((semconv.EVENT_UPSTREAM_DONE, record.ns(summary.completed_at)))
        aborted_at = summary.aborted_at
        if summary.outcome is Outcome.CLIENT_DISCONNECTED and aborted_at is not None:
            events.append((semconv.EVENT_CLIENT_DISCONNECT, record.ns(aborted_at)))
        error = summary.error
        error_at = record.ns(aborted_at if aborted_at is not None else summary.end)
        escaped = summary.failure is not None
        error_type = summary.error_type
        status = _UNSET if error_type is None else Status(StatusCode.ERROR, error_type)
        end = record.ns(summary.end)
        direct = record.direct
        if direct is not None:
            exception = None if error is None else exception_event(error, error_at, escaped)
            assert self.spans is not None
            self.spans.end(direct, name, attrs, events, exception, status, end)
            return
        span.update_name(name)
        span.set_attributes(attrs)
        for event, at in events:
            span.add_event(event, timestamp=at)
        if error is not None:
            span.record_exception(error, timestamp=error_at, escaped=escaped)
        if error_type is not None:
            span.set_status(status)
        span.end(end_time=end)


def attributes(summary: Summary) -> dict[str, Any]:
    """The span's attributes at its end (added to those it started with)."""
    attrs: dict[str, Any] = {semconv.OUTCOME: summary.outcome_value}
    status = summary.status
    if status:
        attrs[semconv.HTTP_RESPONSE_STATUS_CODE] = status
    if summary.error_type is not None:
        attrs[semconv.ERROR_TYPE] = summary.error_type
    streaming = summary.streaming
    if summary.genai:
        request = summary.record.request
        attrs.update(summary.series)
        attrs.update(request)
        if streaming and semconv.GEN_AI_REQUEST_STREAM not in request:
            attrs[semconv.GEN_AI_REQUEST_STREAM] = True
    if streaming:
        attrs[semconv.CHUNKS] = summary.chunks
        attrs[semconv.BYTES] = summary.bytes
        attrs[semconv.KEEPALIVES] = summary.keepalives
        if summary.dialect is not None:
            attrs[semconv.DIALECT] = summary.dialect.name
    stats = summary.stats
    if stats is not None:
        attrs[semconv.TOKENS] = summary.tokens
        if stats.response_id is not None:
            attrs[semconv.GEN_AI_RESPONSE_ID] = stats.response_id
        if stats.response_model is not None:
            attrs[semconv.GEN_AI_RESPONSE_MODEL] = stats.response_model
        if summary.finish_reasons:  # a tuple, as the SDK keeps a sequence
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = summary.finish_reasons
        if summary.input_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = summary.input_tokens
        if summary.output_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = summary.output_tokens
    if summary.ttft is not None:
        attrs[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = summary.ttft
    for name, value in (
        (semconv.GAP_P50, summary.p50),
        (semconv.GAP_P99, summary.p99),
        (semconv.GAP_MAX, summary.gap_max),
        (semconv.TOKENS_PER_SECOND, summary.tokens_per_second),
        (semconv.CANCEL_LATENCY, summary.cancel_latency),
    ):
        if value is not None:
            attrs[name] = value
    if summary.output is not None:
        reasons = summary.finish_reasons
        completed = summary.outcome is Outcome.COMPLETED
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = output_messages(
            summary.output, reasons[-1] if reasons and completed else None
        )
    return attrs
