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
    """Ends each stream's span; `spans` are the direct spans, when they are used; `names` the
    GenAI names OTEL_SEMCONV_STABILITY_OPT_IN chose."""

    name = "span"

    def __init__(self, spans: DirectSpans | None, names: semconv.GenAINames) -> None:
        self.spans = spans
        self.names = names

    def emit(self, summary: Summary) -> None:
        record = summary.record
        span = record.span
        if span is None:  # no spans configured, or none made for this request
            return
        direct = record.direct
        if direct is None:
            attrs = attributes(summary, {}, self.names)
        elif direct.attributes is None:  # the sampler dropped it: nothing is recorded
            return
        else:  # added to those it started with, in place (DirectSpans.end merges them so)
            attrs = attributes(summary, direct.attributes, self.names)
        name = record.method
        if summary.genai:
            operation = summary.operation
            model = summary.model
            name = f"{operation} {model}" if model else str(operation)
        ns = record.ns
        events = []
        at = summary.first_token_at
        if at is not None:
            events.append((semconv.EVENT_FIRST_CHUNK, ns(at)))
        at = summary.completed_at
        if at is not None and summary.streaming:
            events.append((semconv.EVENT_UPSTREAM_DONE, ns(at)))
        aborted_at = summary.aborted_at
        if aborted_at is not None and summary.outcome is Outcome.CLIENT_DISCONNECTED:
            events.append((semconv.EVENT_CLIENT_DISCONNECT, ns(aborted_at)))
        error = summary.error
        error_type = summary.error_type
        status = _UNSET if error_type is None else Status(StatusCode.ERROR, error_type)
        end = ns(summary.end)
        if direct is not None:
            exception = None
            if error is not None:
                error_at = ns(aborted_at) if aborted_at is not None else end
                exception = exception_event(error, error_at, summary.failure is not None)
            assert self.spans is not None
            self.spans.end(direct, name, attrs, events, exception, status, end)
            return
        span.update_name(name)
        span.set_attributes(attrs)
        for event, at in events:
            span.add_event(event, timestamp=at)
        if error is not None:
            error_at = ns(aborted_at) if aborted_at is not None else end
            span.record_exception(error, timestamp=error_at, escaped=summary.failure is not None)
        if error_type is not None:
            span.set_status(status)
        span.end(end_time=end)


def attributes(
    summary: Summary, attrs: dict[str, Any], names: semconv.GenAINames
) -> dict[str, Any]:
    """`attrs` with the span's attributes at its end added, in their order."""
    attrs[semconv.OUTCOME] = summary.outcome_value
    value: Any = summary.status
    if value:
        attrs[semconv.HTTP_RESPONSE_STATUS_CODE] = value
    value = summary.error_type
    if value is not None:
        attrs[semconv.ERROR_TYPE] = value
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
        if summary.stream_id is not None:
            attrs[semconv.RESUME_STREAM_ID] = summary.stream_id
            attrs[semconv.RESUMES] = summary.resumes or 0
            attrs[semconv.RESUME_END_SEEN] = bool(summary.end_seen)
        dialect = summary.dialect
        if dialect is not None:
            attrs[semconv.DIALECT] = dialect.name
    elif summary.bytes is not None:  # a response that is not a stream: its bytes only
        attrs[semconv.BYTES] = summary.bytes
    stats = summary.stats
    if stats is not None:
        if summary.tokens is not None:  # chunks counted: a stream's
            attrs[semconv.TOKENS] = summary.tokens
        value = stats.response_id
        if value is not None:
            attrs[semconv.GEN_AI_RESPONSE_ID] = value
        value = stats.response_model
        if value is not None:
            attrs[semconv.GEN_AI_RESPONSE_MODEL] = value
        value = summary.finish_reasons
        if value:  # a tuple, as the SDK keeps a sequence
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = value
        value = summary.input_tokens
        if value is not None:
            attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = value
        value = summary.output_tokens
        if value is not None:
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = value
            attrs[semconv.USAGE_SOURCE] = summary.usage_source
        stats = summary.stats
        if stats is not None:
            for key, count in (
                (semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, stats.cache_read_tokens),
                (names.cache_write_input_tokens, stats.cache_creation_tokens),
                (semconv.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, stats.reasoning_tokens),
            ):
                if count is not None:
                    attrs[key] = count
    value = summary.ttft
    if value is not None:
        attrs[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = value
    value = summary.p50
    if value is not None:
        attrs[semconv.GAP_P50] = value
    value = summary.p99
    if value is not None:
        attrs[semconv.GAP_P99] = value
    value = summary.gap_max
    if value is not None:
        attrs[semconv.GAP_MAX] = value
    value = summary.tokens_per_second
    if value is not None:
        attrs[semconv.TOKENS_PER_SECOND] = value
    value = summary.cancel_latency
    if value is not None:
        attrs[semconv.CANCEL_LATENCY] = value
    if summary.output is not None:
        reasons = summary.finish_reasons
        completed = summary.outcome is Outcome.COMPLETED
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = output_messages(
            summary.output, reasons[-1] if reasons and completed else None
        )
    return attrs
