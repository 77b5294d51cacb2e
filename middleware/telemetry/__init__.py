"""Telemetry for StreamGuard: one span per stream, GenAI metrics, Prometheus text, an access line.

Off unless a `Telemetry` is handed to `StreamGuard(..., telemetry=...)`. The guard core never
imports this package: a `Telemetry` supplies the cycle class the guard runs each request with
(`observed.ObservedCycle`), and that subclass is the one seam between the two. The modules:
`pipeline` (the process-wide providers and instruments, `from_env`), `observed` (the
telemetry-aware cycle), `record` (one request's state), `answer` (a response that is not a
stream, as it passes: a GenAI call's usage), `kinds` (what a request was: a stream, a GenAI
call, other traffic), `finish` (its end: a `summary.Summary` handed to the `sinks`: `span`,
`metrics`, `access`), `gaps`, `instruments` (the per-stream instruments, aggregated here),
`prometheus`, `access_handler` (the access lines' batched writer), `content`,
`semconv` (every attribute and metric name), `direct`, `otlp_encoder` and `otlp` (the span
fast path), `otel_sdk` (every use of OpenTelemetry's private internals, version-gated).
"""

import functools

from middleware.telemetry.observed import ObservedCycle
from middleware.telemetry.pipeline import (
    CONTENT_TYPE,
    Pipeline,
    SpanKind,
    configure_access_log,
    prometheus_text,
)

__all__ = ["CONTENT_TYPE", "SpanKind", "Telemetry", "configure_access_log", "prometheus_text"]


class Telemetry(Pipeline):
    """What StreamGuard takes as `telemetry`: the process's pipeline (see `Pipeline`,
    `Telemetry.from_env()`), and the cycle class every request runs with."""

    @functools.cached_property
    def cycle_class(self) -> type[ObservedCycle]:
        """`ObservedCycle` bound to this telemetry: a subclass per `Telemetry`, so that a
        request reads its telemetry as a class attribute."""
        return type("ObservedCycle", (ObservedCycle,), {"telemetry": self, "__slots__": ()})
