"""Every use of OpenTelemetry's private internals, in one module, behind one version gate.

Checked against opentelemetry-api 1.45.2, opentelemetry-sdk 1.45.2,
opentelemetry-exporter-otlp-proto-http 1.45.2 and opentelemetry-exporter-http-transport 0.66b2
(`CHECKED`). With any other version installed, `checked()` is false (and says so once in the
log) and every function here takes the public path instead: sidestream then makes the SDK's
own spans (`Telemetry` uses a tracer where it would use direct spans) and exports them with
the SDK's own OTLP exporter and encoder. Correct either way; only slower.

What is read here, and the public path without it:

- The SDK's span and event classes' fields (`ReadableSpan._attributes`, `_events`, ...) and
  `BoundedAttributes._dict`, which the OTLP encoder reads instead of their properties (each a
  Python call, and a mapping proxy walked in Python): `SpanReader`; else the properties.
- The SDK's OTLP/HTTP span exporter's HTTP client (`_client`, handed bytes already encoded),
  its `_shutdown` flag, and its `_transport=` argument with the urllib3 transport of the private
  module `opentelemetry.exporter.http.transport._urllib3`; else the exporter's own `export`.
- A metric exporter's `_preferred_temporality` and `_preferred_aggregation`, copied to the
  wrapper that adds sidestream's local metrics to each export; else the SDK's defaults (the
  one SDK instrument behind that wrapper is a gauge, which they do not change).
- The API's `CompositePropagator._propagators`: is the global propagator W3C's alone, so that
  the sidecar can write `traceparent` itself; else not known, and the propagator writes it.
- Not names but behaviour, which direct spans rely on: the SDK's default samplers are told
  apart by their descriptions (`sampler_policy`); the SDK's Batch and Simple span processors
  read nothing of an ended span but its `context`, so they may be handed a span already
  encoded (`encoding_exporter`). Without the gate there are no direct spans at all.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
from collections.abc import Callable, ItemsView, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.propagators.composite import CompositePropagator

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Link, SpanKind, Status

logger = logging.getLogger("sidestream")

CHECKED: Final[Mapping[str, frozenset[str]]] = {
    "opentelemetry-api": frozenset({"1.45.2"}),
    "opentelemetry-sdk": frozenset({"1.45.2"}),
    "opentelemetry-exporter-otlp-proto-http": frozenset({"1.45.2"}),
    "opentelemetry-exporter-http-transport": frozenset({"0.66b2"}),
}


def installed() -> dict[str, str | None]:
    """The installed version of each package in `CHECKED` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in CHECKED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def checked() -> bool:
    """Are the installed OpenTelemetry packages the versions checked? Decided once per process
    (tests clear it with `checked.cache_clear()`), logged once when not."""
    unchecked = [
        f"{name} {version or '(not installed)'}"
        for name, version in installed().items()
        if version not in CHECKED[name]
    ]
    if unchecked:
        logger.warning(
            "OpenTelemetry %s: not a version sidestream's fast paths were checked against;"
            " using the SDK's own spans and OTLP exporter",
            ", ".join(unchecked),
        )
    return not unchecked


# -- spans, as the OTLP encoder reads them ------------------------------------------------------

SpanParts = tuple[
    Any, Any, str, "SpanKind", "int | None", "int | None", "Mapping[str, Any] | None", int,
    "Sequence[Event]", int, "Sequence[Link]", int, "Status",
]  # fmt: skip
EventParts = tuple[str, int, "Mapping[str, Any] | None", int]


class SpanReader:
    """How the OTLP encoder reads a span (`span`: context, parent, name, kind, start and end
    times, attributes, events and links each with its dropped count, status), an event
    (`event`: name, time, attributes, dropped count) and an attribute mapping (`items`).

    Where `checked()`, the SDK's own classes are read from their fields: ReadableSpan's
    properties are Python functions, its `attributes` a MappingProxyType walked in Python and
    its `dropped_*` ABC isinstance checks. Any other class, or any class without the gate,
    through its public API."""

    __slots__ = ("event", "items", "span")

    def __init__(self, fields: bool | None = None) -> None:
        if fields if fields is not None else checked():
            from opentelemetry.sdk import trace as sdk_trace

            spans = {sdk_trace.ReadableSpan, sdk_trace.Span}
            spans.add(getattr(sdk_trace, "_Span", sdk_trace.ReadableSpan))  # what its tracer makes
            self.span: Callable[[ReadableSpan], SpanParts] = functools.partial(
                _span_fields, frozenset(spans)
            )
            self.event: Callable[[Event], EventParts] = functools.partial(
                _event_fields, sdk_trace.Event
            )
            self.items: Callable[[Mapping[str, Any]], ItemsView[str, Any]] = _dict_items
        else:
            self.span, self.event, self.items = _span_public, _event_public, _items


_PLAIN = frozenset({list, tuple})


def _span_fields(classes: frozenset[type], span: ReadableSpan) -> SpanParts:
    if type(span) not in classes:
        return _span_public(span)
    fields = span.__dict__
    attributes, events, links = fields["_attributes"], fields["_events"], fields["_links"]
    dropped_attributes = dropped_events = dropped_links = 0
    if type(attributes) is not dict and attributes is not None:
        dropped_attributes = attributes.dropped  # BoundedAttributes
        attributes = attributes._dict
    if type(events) not in _PLAIN:
        dropped_events = events.dropped  # BoundedList
    if type(links) not in _PLAIN:
        dropped_links = links.dropped
    return (
        fields["_context"], fields["_parent"], fields["_name"], fields["_kind"],
        fields["_start_time"], fields["_end_time"], attributes, dropped_attributes,
        events, dropped_events, links, dropped_links, fields["_status"],
    )  # fmt: skip


def _span_public(span: ReadableSpan) -> SpanParts:
    return (
        span.get_span_context(), span.parent, span.name, span.kind, span.start_time,
        span.end_time, span.attributes, span.dropped_attributes, span.events,
        span.dropped_events, span.links, span.dropped_links, span.status,
    )  # fmt: skip


def _event_fields(event_class: type, event: Event) -> EventParts:
    if type(event) is not event_class:
        return _event_public(event)
    fields = event.__dict__
    attributes = fields["_attributes"]
    dropped = 0
    if type(attributes) is not dict and attributes is not None:
        dropped = attributes.dropped  # BoundedAttributes
    return fields["_name"], fields["_timestamp"], attributes, dropped


def _event_public(event: Event) -> EventParts:
    return event.name, event.timestamp, event.attributes, event.dropped_attributes


def _dict_items(attributes: Mapping[str, Any]) -> ItemsView[str, Any]:
    """The items of `attributes`; of a BoundedAttributes (a Mapping whose items() runs in
    Python), its dict's."""
    if type(attributes) is dict:
        return attributes.items()
    return getattr(attributes, "_dict", attributes).items()


def _items(attributes: Mapping[str, Any]) -> ItemsView[str, Any]:
    return attributes.items()


# -- the SDK's OTLP/HTTP span exporter ----------------------------------------------------------


def urllib3_transport() -> Any | None:
    """The SDK's urllib3 HTTP transport for its OTLP span exporter (`exporter_arguments`), or
    None: without the gate, where the exporter takes no transport, or where the (private)
    module is missing."""
    if not checked():
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if "_transport" not in inspect.signature(OTLPSpanExporter.__init__).parameters:
        return None
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
    except ImportError:
        return None
    return Urllib3HTTPTransport()


def transport_chosen(kwargs: Mapping[str, Any]) -> bool:
    """Do the exporter's arguments choose its HTTP client already (a transport or session)?"""
    return bool({"_transport", "session"} & kwargs.keys())


def exporter_arguments(transport: Any) -> dict[str, Any]:
    """The keyword argument that gives the SDK's OTLP span exporter `transport`."""
    return {"_transport": transport}


def sends_bytes(exporter: SpanExporter) -> bool:
    """Can `exporter` (the SDK's OTLP/HTTP span exporter, or a subclass) be handed a request
    already encoded (`send`)? Its HTTP client is not public API."""
    client = getattr(exporter, "_client", None)
    return checked() and callable(getattr(client, "export", None))


def send(exporter: SpanExporter, data: bytes) -> bool:
    """Export the encoded request `data` through `exporter`'s own HTTP client (endpoint,
    headers, compression, timeout and retries its own); True on success."""
    return bool(exporter._client.export(data).success)  # type: ignore[attr-defined]


def is_shut_down(exporter: SpanExporter) -> bool:
    return bool(getattr(exporter, "_shutdown", False))


# -- metric exporters ---------------------------------------------------------------------------


def metric_preferences(exporter: MetricExporter) -> dict[str, Any]:
    """`exporter`'s preferred temporality and aggregation, as MetricExporter's keyword
    arguments (none without the gate: the SDK's defaults)."""
    if not checked():
        return {}
    return {
        "preferred_temporality": getattr(exporter, "_preferred_temporality", None),
        "preferred_aggregation": getattr(exporter, "_preferred_aggregation", None),
    }


# -- propagation --------------------------------------------------------------------------------


def propagators(textmap: TextMapPropagator) -> Sequence[TextMapPropagator] | None:
    """The propagators `textmap` runs, in order: a CompositePropagator's, or itself alone;
    None when that is not known (a CompositePropagator without the gate)."""
    if type(textmap) is not CompositePropagator:
        return (textmap,)
    if not checked():
        return None
    parts = getattr(textmap, "_propagators", None)
    return parts if isinstance(parts, list | tuple) else None


# -- what direct spans assume -------------------------------------------------------------------

ALWAYS_ON, ALWAYS_OFF, PARENT_BASED_ALWAYS_ON = "always_on", "always_off", "parentbased_always_on"


def sampler_policy(sampler: Sampler) -> str | None:
    """Which of the SDK's default samplers `sampler` is (`OTEL_TRACES_SAMPLER` always_on,
    always_off, or parentbased_always_on, the default, with its default delegates): their
    decisions need only the parent's sampled flag. None for any other sampler, asked per span."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON as ON
    from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler

    if type(sampler) is StaticSampler:
        return ALWAYS_ON if sampler.get_description() == ON.get_description() else ALWAYS_OFF
    default = ParentBased(ON).get_description()  # type: ignore[no-untyped-call]
    if type(sampler) is ParentBased and sampler.get_description() == default:  # type: ignore[no-untyped-call]
        return PARENT_BASED_ALWAYS_ON
    return None


def encoding_exporter(processor: SpanProcessor) -> SpanExporter | None:
    """The exporter behind `processor` when `processor` is the SDK's Batch or Simple span
    processor: they read nothing of an ended span but `context` (sampled?) before handing it
    to their exporter, so they may be handed a span that exporter wrote already. None for any
    other processor, and without the gate."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if not checked() or type(processor) not in (BatchSpanProcessor, SimpleSpanProcessor):
        return None
    return getattr(processor, "span_exporter", None)
