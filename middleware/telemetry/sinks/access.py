"""The access-line sink: one JSON object per request on the `sidestream.access` logger.

For streams and GenAI calls (`kinds`); other traffic only with `Telemetry(access_all=True)`.
The line's keys are written once, here, and its values by `%` (json.dumps would escape every
key again for every stream): strings through json's own escaping (`_text`), numbers as `_int`
and `_ms` write them. Where `configure_access_log`'s handler is the logger's only way out
(`access_handler.sole`) the line goes to it directly, without a `LogRecord`.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import TYPE_CHECKING

from middleware.telemetry import semconv
from middleware.telemetry.access_handler import sole
from middleware.telemetry.kinds import OTHER

if TYPE_CHECKING:
    from middleware.telemetry.summary import Summary

ACCESS_FIELDS = (
    "time", "level", "logger", "request_id", "trace_id", "span_id", "method", "path",
    "model", "outcome", "status", "stream", "ttft_ms", "itl_p50_ms", "itl_p99_ms",
    "itl_max_ms", "tokens", "input_tokens", "output_tokens", "usage_source", "tokens_per_s",
    "duration_ms",
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
# With resume on, three more: the stream's id, resumes served, whether a reader read its end.
_RESUME = ',"stream_id":%s,"resumes":%s,"end_seen":%s}'
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


class AccessSink:
    """Writes each stream's and GenAI call's line to `log` (when it takes INFO); every
    request's, other traffic too, with `every`."""

    name = "access"

    def __init__(self, log: logging.Logger, every: bool = False) -> None:
        self.log = log
        self.every = every

    def emit(self, summary: Summary) -> None:
        log = self.log
        if (summary.kind is OTHER and not self.every) or not log.isEnabledFor(logging.INFO):
            return
        record = summary.record
        span = record.span
        context = span.get_span_context() if span is not None else None
        if context is not None and not context.is_valid:  # a property: asked once
            context = None
        tokens_per_second = summary.tokens_per_second
        message = _LINE % (
            _timestamp(),
            _quote(record.request_id),
            f'"{context.trace_id:032x}"' if context else "null",
            f'"{context.span_id:016x}"' if context else "null",
            _quote(record.method),
            _quote(record.path),
            _text(summary.model),
            _quote(summary.outcome_value),
            _int(summary.status or None),
            "true" if summary.streaming else "false",
            _ms(summary.ttft),
            _ms(summary.p50),
            _ms(summary.p99),
            _ms(summary.gap_max),
            _int(summary.tokens),
            _int(summary.input_tokens),
            _int(summary.output_tokens),
            _text(summary.usage_source),
            "null" if tokens_per_second is None else f"{tokens_per_second:.2f}",
            _ms(summary.duration),
            _int(summary.bytes),
            _int(summary.chunks),
            _int(summary.keepalives),
            _ms(summary.cancel_latency),
        )
        if summary.stream_id is not None:
            seen = "true" if summary.end_seen else "false"
            message = message[:-1] + _RESUME % (_quote(summary.stream_id), summary.resumes, seen)
        handler = sole(log)
        if handler is not None:  # configure_access_log's handler alone: the line, no LogRecord
            handler.write(message)
        else:  # handle() a record made here: Logger.info would walk the stack for the caller
            log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, (), None))
