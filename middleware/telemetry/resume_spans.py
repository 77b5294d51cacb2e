"""A resume request's own short span, linked to the span of the stream it reads.

The generating stream keeps its one span; each resume request adds one span of its own, from
its arrival to its end, with a link to the generating stream's span context (kept in the
store as `<trace id>-<span id>`, so a replica that did not produce the stream links it too).
`middleware.resume` asks for it through `Resume(tracer=ResumeSpans(provider))`.
"""

from __future__ import annotations

from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags, TracerProvider

from middleware.telemetry import semconv

NAME = "sidestream.resume"


class ResumeSpans:
    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer(semconv.INSTRUMENTATION_SCOPE)

    def start(self, stream_id: str, after: int, link: str) -> Span:
        links = []
        if link:
            trace_id, _, span_id = link.partition("-")
            context = SpanContext(
                int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(1)
            )
            links.append(Link(context))
        attributes: dict[str, str | int] = {
            semconv.RESUME_STREAM_ID: stream_id,
            semconv.RESUME_AFTER: after,
        }
        return self.tracer.start_span(
            NAME, kind=SpanKind.SERVER, links=links, attributes=attributes
        )
