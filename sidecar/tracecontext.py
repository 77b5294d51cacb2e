"""The trace context the upstream gets: the sidecar's span as the parent of the inference
server's spans.

Its own module: propagation is telemetry's concern, not the relay's, and runs once per
request, never per chunk. The default W3C propagation is written out by hand (see
`inject_trace_context`); any other goes through OpenTelemetry's propagator.
"""

from __future__ import annotations

from operator import itemgetter

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.headers import Headers


def inject_trace_context(headers: Headers) -> None:
    """Send the current span's context upstream (W3C `traceparent`, replacing the client's).

    StreamGuard with telemetry makes the request's span current around the app, so the
    inference server's spans become children of the sidecar's span, not siblings. With no
    current span (telemetry off) the client's own trace headers pass through unchanged.

    With the default propagation (`OTEL_PROPAGATORS` W3C trace context, with or without W3C
    baggage) and no baggage in the context, the headers are written here as the propagator
    writes them, without its context lookups; any other propagator writes its own.
    """
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return
    if _w3c_propagation() and not baggage.get_all():
        # TraceContextTextMapPropagator.inject's two headers, replacing the client's (which
        # few send: the names are looked at in C, the list rebuilt only when they do).
        if not _W3C_FIELDS.isdisjoint(map(_NAME, headers)):
            headers[:] = [(name, value) for name, value in headers if name not in _W3C_FIELDS]
        parent = b"00-%032x-%016x-%02x" % (
            span_context.trace_id,
            span_context.span_id,
            span_context.trace_flags,
        )
        headers.append((b"traceparent", parent))
        if span_context.trace_state:
            headers.append((b"tracestate", span_context.trace_state.to_header().encode("latin-1")))
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    drop = {name.encode("latin-1") for name in carrier} | _W3C_FIELDS
    headers[:] = [(name, value) for name, value in headers if name not in drop]
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items())


_W3C_FIELDS = frozenset({b"traceparent", b"tracestate"})
_NAME = itemgetter(0)
_W3C_PROPAGATORS = (TraceContextTextMapPropagator, W3CBaggagePropagator)
_w3c_decided: tuple[object, bool] = (None, False)  # (global propagator, is it W3C's alone)


def _w3c_propagation() -> bool:
    """Is the global propagator W3C trace context, alone or with W3C baggage (the default)?
    Decided once per propagator object (`set_global_textmap` replaces it)."""
    global _w3c_decided
    textmap = propagate.get_global_textmap()
    if _w3c_decided[0] is not textmap:
        # Imported here, once per propagator: the proxy itself does not need telemetry loaded.
        from middleware.telemetry.otel_sdk import propagators

        parts = propagators(textmap)  # None: not known (a composite's parts are private)
        w3c = (
            parts is not None
            and any(type(p) is TraceContextTextMapPropagator for p in parts)
            and all(type(p) in _W3C_PROPAGATORS for p in parts)
        )
        _w3c_decided = (textmap, w3c)
    return _w3c_decided[1]
