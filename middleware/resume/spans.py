"""The generating stream's span context, kept with the stream so that each resume request's
own span (made by telemetry: `middleware.telemetry.resume_spans`) can link to it."""

from __future__ import annotations

from opentelemetry import trace


def current_link() -> str:
    """The current span's context as `<trace id>-<span id>` ("" when there is none)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"{context.trace_id:032x}-{context.span_id:016x}"
