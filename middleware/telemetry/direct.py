"""Direct spans: a stream's span written once, at its end, without the SDK's `Span` object.

The SDK's span is a large share of what telemetry costs a stream: a lock per call and every
attribute cleaned as it is set (sidestream sets 40-odd), then copied into a `ReadableSpan`
at `end()`. sidestream's span needs none of that: nothing reads or changes it while the stream runs, and its attributes are built
from values whose types it controls. So a `DirectSpans` makes the decisions the SDK's
`Tracer.start_span` makes at request arrival (parent, sampling, ids, trace flags) and keeps
only the resulting `SpanContext`; at the end `end()` builds the finished `ReadableSpan` and
hands it to the span processor, as the SDK's `Span.end()` does. Exporters and processors
receive what they always receive. `tests/test_telemetry_direct.py` holds it to the SDK's
output, span for span. `Telemetry` makes direct spans only where the installed SDK is a
version `otel_sdk` was checked against: they rely on how its samplers and span processors
behave; otherwise it makes the SDK's own spans.

Deliberate differences from SDK spans (do not "fix" these):

- While the stream runs, the current span is a `NonRecordingSpan` carrying the context:
  children (and the upstream's spans, through the injected traceparent) nest under it, but
  code inside the guard cannot add attributes or events to it.
- Processors see `on_end` only (there is no SDK `Span` to give `on_start`). The sidecar
  uses one `BatchSpanProcessor`; `Telemetry(tracer_provider=...)` keeps SDK spans for
  applications that need every processor hook.
- A Batch or Simple span processor in front of this package's OTLP exporter
  (`otlp.OTLPSpanExporter`, what `Telemetry.from_env` builds) gets each span
  already written in OTLP (`otlp_encoder.EncodedSpan`), not a `ReadableSpan`: those
  processors read only its context (`otel_sdk.encoding_exporter`) and that exporter only its
  bytes, and the end of a stream then builds no ReadableSpan, no Event objects, and no
  second pass over them.
- Span limits (`OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`, `..._VALUE_LENGTH_LIMIT`) are applied with
  the SDK's `BoundedAttributes`, but only when the span would exceed them.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context, get_current
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, TraceFlags

from middleware.telemetry import otel_sdk, semconv
from middleware.telemetry.otel_sdk import ALWAYS_ON, PARENT_BASED_ALWAYS_ON
from middleware.telemetry.otlp_encoder import EncodedSpan, Encoder

# W3C Trace Context level 2's random flag, where the installed API knows it (as the SDK sets it).
_RANDOM_TRACE_ID: int = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
# Module globals: read off its class per span, an Enum member goes through EnumType's
# `__getattr__` hook (Python 3.11), and a class attribute through the type's generic lookup.
_DROP, _SAMPLE = Decision.DROP, Decision.RECORD_AND_SAMPLE
_SAMPLED, _DEFAULT = TraceFlags.SAMPLED, TraceFlags.DEFAULT


class DirectSpan:
    """A started direct span: what its end needs from its start."""

    __slots__ = ("attributes", "context", "current", "parent", "start_time")

    def __init__(
        self,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any] | None,
        start_time: int,
    ) -> None:
        self.context = context
        self.parent = parent
        self.attributes = attributes  # None: not recorded (the sampler dropped it)
        self.start_time = start_time
        self.current = NonRecordingSpan(context)  # the current span while the stream runs


class DirectSpans:
    """Starts and ends direct spans for one `TracerProvider`'s configuration (sampler, id
    generator, resource) and hands the ended ones to `processor`."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor, kind: SpanKind) -> None:
        self.sampler = provider.sampler
        self.policy = otel_sdk.sampler_policy(provider.sampler)
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.processor = processor
        self.kind = kind
        self.scope = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE, "", "", {})  # get_tracer's
        self.limits = SpanLimits()  # from the OTEL_* variables, as the provider's
        # In front of this package's OTLP exporter, a span is written in OTLP at its end
        # (`otlp_encoder.EncodedSpan`): no ReadableSpan, no Event objects, no second read.
        # (`otlp` imported only then: that module loads the HTTP client.)
        self.encoder: Encoder | None = None
        exporter = otel_sdk.encoding_exporter(processor)
        if type(exporter).__module__ == "middleware.telemetry.otlp":
            from middleware.telemetry.otlp import OTLPSpanExporter

            if isinstance(exporter, OTLPSpanExporter) and exporter.fast:
                self.encoder = Encoder()

    def start(
        self, name: str, parent: Context | None, attributes: dict[str, Any], start_time: int
    ) -> DirectSpan:
        """What `Tracer.start_span` decides: trace id (the parent's, else new), sampling,
        flags, a new span id; a span the sampler drops keeps its context (it is still
        propagated) and records nothing."""
        # The parent: in `parent`, else in the current context (none at all in the sidecar:
        # an empty Context, read without the span lookup).
        around = parent if parent is not None else get_current()
        parent_context: SpanContext | None = None
        if around:
            parent_context = trace.get_current_span(around).get_span_context()
        if parent_context is None or not parent_context.is_valid:
            parent_context = None
            trace_id = self.ids.generate_trace_id()
            random = _RANDOM_TRACE_ID if _RANDOM_TRACE_ID and self.ids.is_trace_id_random() else 0
        else:
            trace_id = parent_context.trace_id
            random = parent_context.trace_flags & _RANDOM_TRACE_ID
        policy = self.policy
        if policy is None:
            result = self.sampler.should_sample(parent, trace_id, name, self.kind, attributes)
            decision, trace_state = result.decision, result.trace_state
            recorded = None if decision is _DROP else dict(result.attributes or {})
        else:  # the SDK's default samplers, decided here as they decide (without their calls)
            sampled = policy == ALWAYS_ON or (
                policy == PARENT_BASED_ALWAYS_ON
                and (parent_context is None or parent_context.trace_flags.sampled)
            )
            decision = _SAMPLE if sampled else _DROP
            trace_state = None if parent_context is None else parent_context.trace_state
            recorded = dict(attributes) if sampled else None
        flags = _SAMPLED if decision is _SAMPLE else _DEFAULT
        context = SpanContext(
            trace_id,
            self.ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags | random),
            trace_state=trace_state,
        )
        return DirectSpan(context, parent_context, recorded, start_time)

    def end(
        self,
        span: DirectSpan,
        name: str,
        attributes: Mapping[str, Any],
        events: list[tuple[str, int]],
        error: Event | None,
        status: Status,
        end_time: int,
    ) -> None:
        """Hand the finished span to the processor (nothing for one the sampler dropped):
        `attributes` are added to those it started with (or are those already: the span sink
        adds them in place), `events` are (name, time) pairs, `error` an exception event to
        add after them."""
        merged = span.attributes
        if merged is None:
            return
        if attributes is not merged:
            merged.update(attributes)
        limits = self.limits
        bounded: Mapping[str, Any] = merged
        most = limits.max_span_attributes
        if (most is not None and len(merged) > most) or limits.max_span_attribute_length:
            bounded = BoundedAttributes(
                most,
                merged,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        encoder = self.encoder
        most_events = limits.max_events
        if (
            encoder is not None
            and bounded is merged
            and (most_events is None or len(events) < most_events)
        ):
            timed: list[Event | tuple[str, int]] = list(events)
            if error is not None:
                timed.append(error)
            context = span.context
            data = encoder.write(
                context, span.parent, name, self.kind, span.start_time, end_time,
                merged, 0, timed, 0, (), 0, status,
            )  # fmt: skip
            encoded = EncodedSpan(context, data, self.resource, self.scope)
            self.processor.on_end(encoded)  # type: ignore[arg-type]
            return
        sdk_events = [Event(event, None, at) for event, at in events]
        if error is not None:
            sdk_events.append(error)
        self.processor.on_end(
            ReadableSpan(
                name,
                context=span.context,
                parent=span.parent,
                resource=self.resource,
                attributes=bounded,
                events=sdk_events[: limits.max_events],
                kind=self.kind,
                status=status,
                start_time=span.start_time,
                end_time=end_time,
                instrumentation_scope=self.scope,
            )
        )


def exception_event(error: BaseException, timestamp: int, escaped: bool) -> Event:
    """The event `Span.record_exception` adds, with the same attributes."""
    module = type(error).__module__
    qualname = type(error).__qualname__
    attributes = {
        semconv.EXCEPTION_TYPE: f"{module}.{qualname}"
        if module and module != "builtins"
        else qualname,
        semconv.EXCEPTION_MESSAGE: str(error),
        semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(error)),
        semconv.EXCEPTION_ESCAPED: str(escaped),
    }
    return Event(semconv.EVENT_EXCEPTION, attributes, timestamp)
