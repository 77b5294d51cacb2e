"""The end of one request's telemetry: span attributes and events, metrics, the access log.

Runs once per request, after the cycle has run (terminal event written, app stopped). Usage
and partial counts are recorded whatever the outcome: a cancelled stream reports the
tokens it relayed. `gen_ai.usage.output_tokens` is the upstream's usage when the stream
carried it, else the content-carrying events counted (`sidestream.tokens`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Status, StatusCode

from middleware.errors import Outcome
from middleware.telemetry import semconv
from middleware.telemetry.access_log import sole
from middleware.telemetry.content import output_messages
from middleware.telemetry.direct import exception_event
from middleware.telemetry.metrics import Key, series

if TYPE_CHECKING:
    from middleware.telemetry.record import Finished as Cycle
    from middleware.telemetry.record import StreamRecord

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
_FAILURE_VALUES = frozenset(o.value for o in FAILURES)
_CANCELLED = frozenset(
    _FAILURE_VALUES | {Outcome.CLIENT_DISCONNECTED.value, Outcome.SLOW_CLIENT.value}
)
_UNSET = Status(StatusCode.UNSET)

# The access-log line: one JSON object, its keys written once here and its values by `%`
# (json.dumps would escape every key again for every stream). Values go in as JSON text:
# strings through json's own escaping (`_text`), numbers as `_ms` and `_int` write them.
ACCESS_FIELDS = (
    "time", "level", "logger", "request_id", "trace_id", "span_id", "method", "path",
    "model", "outcome", "status", "stream", "ttft_ms", "itl_p50_ms", "itl_p99_ms",
    "itl_max_ms", "tokens", "input_tokens", "output_tokens", "tokens_per_s", "duration_ms",
    "bytes", "chunks", "keepalives", "cancel_latency_ms",
)  # fmt: skip
_CONSTANT = {"level": "info", "logger": semconv.ACCESS_LOGGER}
_LINE = (
    "{"
    + ",".join(
        f'"{name}":{json.dumps(_CONSTANT[name]) if name in _CONSTANT else "%s"}'
        for name in ACCESS_FIELDS
    )
    + "}"
)
_quote = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str


def _text(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def _int(value: int | None) -> str:
    return "null" if value is None else str(value)


def _ms(seconds: float | None) -> str:
    """Seconds as milliseconds to the microsecond, or null."""
    return "null" if seconds is None else f"{seconds * 1000.0:.3f}"


@functools.lru_cache(maxsize=2)
def _second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _timestamp() -> str:
    """Now in UTC as JSON text, to the millisecond: "2026-12-02T01:22:16.123Z"."""
    now = time.time()
    second = int(now)
    return f'"{_second(second)}.{int((now - second) * 1000):03d}Z"'


@functools.lru_cache(maxsize=1024)
def _usage_series(key: Key) -> tuple[Key, Key]:
    """The token-usage series (input, output) of a stream's series `key`."""
    attributes = dict(key)
    return (
        series({**attributes, semconv.GEN_AI_TOKEN_TYPE: "input"}),
        series({**attributes, semconv.GEN_AI_TOKEN_TYPE: "output"}),
    )


def finish(record: StreamRecord, cycle: Cycle, failure: BaseException | None) -> None:
    telemetry = record.telemetry
    end = time.monotonic()
    outcome = cycle.outcome
    if isinstance(failure, asyncio.CancelledError):
        failure = None  # the server cancelled the request task: not the app's failure
    elif failure is not None and outcome is Outcome.COMPLETED:
        outcome = Outcome.UPSTREAM_ERROR
    status = cycle.status or (500 if failure is not None else 0)
    error_type: str | None = None
    outcome_value: str = outcome._value_  # `.value` is an Enum property (a Python call)
    if outcome_value in _FAILURE_VALUES:
        error_type = outcome_value
    elif failure is not None:
        error_type = type(failure).__qualname__
    elif status >= 500:
        error_type = str(status)

    stats = cycle.stream_stats()
    gaps = record.gaps
    gaps.seal()  # the chunk times not folded yet: sorted, or into the buckets
    streaming = cycle.streaming
    dialect = cycle.dialect or record.genai
    genai = record.genai is not None or streaming
    duration = end - record.t0
    ttft = None if cycle.first_token_at is None else cycle.first_token_at - record.t0
    cancel_latency = None
    if cycle.aborted_at is not None and cycle.stopped_at is not None:
        cancel_latency = max(0.0, cycle.stopped_at - cycle.aborted_at)
    p50, p99 = gaps.quantiles(0.5, 0.99)
    tokens_per_second = gaps.tokens_per_second()
    request = record.request
    model = request.get(semconv.GEN_AI_REQUEST_MODEL)
    input_tokens = stats.input_tokens if stats is not None else None
    output_tokens = None
    if stats is not None:
        output_tokens = stats.output_tokens if stats.output_tokens is not None else stats.tokens

    attrs: dict[str, Any] = {semconv.OUTCOME: outcome_value}
    if status:
        attrs[semconv.HTTP_RESPONSE_STATUS_CODE] = status
    if error_type is not None:
        attrs[semconv.ERROR_TYPE] = error_type
    metric_attrs: dict[str, str | int] = {}
    if genai:
        operation = dialect.operation if dialect is not None else "chat"
        provider = telemetry.provider_name or PROVIDERS.get(
            dialect.name if dialect else "", "unknown"
        )
        metric_attrs[semconv.GEN_AI_OPERATION_NAME] = operation
        metric_attrs[semconv.GEN_AI_PROVIDER_NAME] = provider
        if model is not None:
            metric_attrs[semconv.GEN_AI_REQUEST_MODEL] = model
        metric_attrs.update(record.server)
        attrs.update(metric_attrs)
        attrs.update(request)
        if streaming and semconv.GEN_AI_REQUEST_STREAM not in request:
            attrs[semconv.GEN_AI_REQUEST_STREAM] = True
    if streaming:
        attrs[semconv.CHUNKS] = cycle.chunks
        attrs[semconv.BYTES] = cycle.bytes
        attrs[semconv.KEEPALIVES] = cycle.keepalives
        if dialect is not None:
            attrs[semconv.DIALECT] = dialect.name
    if stats is not None:
        attrs[semconv.TOKENS] = stats.tokens
        if stats.response_id is not None:
            attrs[semconv.GEN_AI_RESPONSE_ID] = stats.response_id
        if stats.response_model is not None:
            attrs[semconv.GEN_AI_RESPONSE_MODEL] = stats.response_model
        reasons = stats.finish_reasons if outcome is Outcome.COMPLETED else ["error"]
        if reasons:
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(reasons)  # as the SDK keeps it
        if input_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
        if output_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    if ttft is not None:
        attrs[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = ttft
    for name, value in (
        (semconv.GAP_P50, p50),
        (semconv.GAP_P99, p99),
        (semconv.GAP_MAX, gaps.max if gaps.count else None),
        (semconv.TOKENS_PER_SECOND, tokens_per_second),
        (semconv.CANCEL_LATENCY, cancel_latency),
    ):
        if value is not None:
            attrs[name] = value
    if record.text is not None and stats is not None:
        reason = stats.finish_reasons[-1] if stats.finish_reasons else None
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = output_messages(
            "".join(record.text), reason if outcome is Outcome.COMPLETED else None
        )

    span = record.span
    if span is not None:
        name = record.method
        if genai:
            operation = str(metric_attrs[semconv.GEN_AI_OPERATION_NAME])
            name = f"{operation} {model}" if model else operation
        events = []
        if cycle.first_token_at is not None:
            events.append((semconv.EVENT_FIRST_CHUNK, record.ns(cycle.first_token_at)))
        if streaming and cycle.completed_at is not None:
            events.append((semconv.EVENT_UPSTREAM_DONE, record.ns(cycle.completed_at)))
        if outcome is Outcome.CLIENT_DISCONNECTED and cycle.aborted_at is not None:
            events.append((semconv.EVENT_CLIENT_DISCONNECT, record.ns(cycle.aborted_at)))
        error = cycle.error if cycle.error is not None else failure
        error_at = record.ns(cycle.aborted_at if cycle.aborted_at is not None else end)
        escaped = failure is not None
        span_status = _UNSET if error_type is None else Status(StatusCode.ERROR, error_type)
        direct = record.direct
        if direct is not None:
            exception = None if error is None else exception_event(error, error_at, escaped)
            assert telemetry.direct is not None
            telemetry.direct.end(
                direct, name, attrs, events, exception, span_status, record.ns(end)
            )
        else:
            span.update_name(name)
            span.set_attributes(attrs)
            for event, at in events:
                span.add_event(event, timestamp=at)
            if error is not None:
                span.record_exception(error, timestamp=error_at, escaped=escaped)
            if error_type is not None:
                span.set_status(span_status)
            span.end(end_time=record.ns(end))

    if not genai:
        return
    key = series(metric_attrs)
    if error_type is not None:
        telemetry.duration.record(
            duration, series({**metric_attrs, semconv.ERROR_TYPE: error_type})
        )
    else:
        telemetry.duration.record(duration, key)
    if streaming and ttft is not None:
        telemetry.ttfc.record(ttft, key)
    telemetry.chunks.fold(gaps, key)
    if input_tokens is not None or output_tokens is not None:
        by_input, by_output = _usage_series(key)
        if input_tokens is not None:
            telemetry.token_usage.record(input_tokens, by_input)
        if output_tokens is not None:
            telemetry.token_usage.record(output_tokens, by_output)
    by_outcome = ((semconv.OUTCOME, outcome_value),)
    telemetry.streams.add(1, by_outcome)
    if cycle.keepalives:
        telemetry.keepalives.add(cycle.keepalives)
    if cycle.aborted_at is not None and outcome_value in _CANCELLED:
        telemetry.cancellations.add(1, by_outcome)

    log = telemetry.access_log
    if not log.isEnabledFor(logging.INFO):
        return
    context = span.get_span_context() if span is not None else None
    if context is not None and not context.is_valid:  # a property: asked once
        context = None
    message = _LINE % (
        _timestamp(),
        _quote(record.request_id),
        f'"{context.trace_id:032x}"' if context else "null",
        f'"{context.span_id:016x}"' if context else "null",
        _quote(record.method),
        _quote(record.path),
        _text(model),
        _quote(outcome_value),
        _int(status or None),
        "true" if streaming else "false",
        _ms(ttft),
        _ms(p50),
        _ms(p99),
        _ms(gaps.max if gaps.count else None),
        _int(stats.tokens if stats is not None else None),
        _int(input_tokens),
        _int(output_tokens),
        "null" if tokens_per_second is None else f"{tokens_per_second:.2f}",
        _ms(duration),
        cycle.bytes,
        cycle.chunks,
        cycle.keepalives,
        _ms(cancel_latency),
    )
    handler = sole(log)
    if handler is not None:  # configure_access_log's handler alone: the line, no LogRecord
        handler.write(message)
    else:  # handle() a record made here: Logger.info would walk the stack for the caller
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, (), None))
