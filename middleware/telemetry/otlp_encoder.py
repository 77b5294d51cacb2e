"""A faster OTLP span encoder: an `ExportTraceServiceRequest` written in protobuf's wire format.

The SDK's encoder builds a protobuf object per span, attribute and value and then copies them
into their parents: more CPU per sidestream span (30-odd attributes) than everything else
telemetry does for a stream of a couple of hundred tokens. `encode_spans` writes the same
request directly, and keeps the encoded bytes of the attributes that repeat from stream to
stream (method, path, model, outcome, ...), so most of a span is a few dictionary hits and
joins. `tests/test_telemetry_otlp.py` parses its output with the official classes and requires
it to equal what the SDK's encoder makes, field for field, for every attribute type.

Pure: no I/O. The SDK's spans are read through `otel_sdk.SpanReader` (their fields where the
installed SDK is a checked version); the exporter that sends the bytes is `otlp`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status

from middleware.speedups import compiled
from middleware.telemetry import otlp_attributes, semconv
from middleware.telemetry.otel_sdk import SpanReader
from middleware.telemetry.otlp_attributes import BYTE as _BYTE
from middleware.telemetry.otlp_attributes import double as _double
from middleware.telemetry.otlp_attributes import varint as _varint

logger = logging.getLogger("sidestream")

_KIND = {  # opentelemetry.proto.trace.v1.Span.SpanKind
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # Span.flags (SpanFlags)
_CACHE_LIMIT = 4096  # encoded string attributes kept (cleared when full)
# Attributes whose value is new with every span: encoded, never kept (they would only fill
# the cache and have it cleared, the repeating ones with them, every few thousand spans).
_UNIQUE = frozenset({semconv.GEN_AI_RESPONSE_ID})
# One tag's caches: whole KeyValues of strings, flags and tuples of strings by (key, value),
# heads of doubles by key, heads of ints by (key, size).
_Tagged = tuple[dict[tuple[str, Any], bytes], dict[str, bytes], dict[tuple[str, int], bytes]]
_T = TypeVar("_T")
_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
# The attributes' loop: `otlp_attributes` compiled by Cython, where built, else interpreted.
_compiled = compiled("middleware.telemetry._otlp")
_attributes = otlp_attributes.attributes if _compiled is None else _compiled.attributes
_NOTHING = object()


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    n = len(payload)
    return tag + (_BYTE[n] if n < 0x80 else _varint(n)) + payload


def _string(tag: bytes, text: str | None) -> bytes:
    return _field(tag, text.encode()) if text else b""


def _value(value: Any) -> bytes:
    """An AnyValue (a oneof: written even when it holds a zero)."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if type(value) in (tuple, list) or isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(
            b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        )
    if value is None:
        return b""
    raise TypeError(f"cannot encode {type(value).__name__} as an OTLP value")


def _keep(cache: dict[Any, _T], key: Any, encoded: _T) -> _T:
    """Store `encoded` in `cache` (emptied first when full) and return it."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = encoded
    return encoded


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _value(value))


class Encoder:
    """Keeps what repeats between spans and batches: resources, scopes, attributes' heads."""

    def __init__(self, reader: SpanReader | None = None) -> None:
        self._read = reader if reader is not None else SpanReader()
        # Per attribute tag (span, event, link, resource, scope): whole string KeyValue fields
        # by (key, value), and the heads of number KeyValues (see `_head`) by key for doubles,
        # by (key, payload size) for ints. Each is cleared when it holds `_CACHE_LIMIT`.
        self._tagged: dict[bytes, _Tagged] = {}
        self._keys: dict[str, bytes] = {}  # encoded key fields
        self._names: dict[str, bytes] = {}  # span name fields
        self._events: dict[str, tuple[bytes, bytes]] = {}  # see _event
        self._statuses: dict[tuple[int, str | None], bytes] = {}  # Status fields, by code
        self._resources: dict[Resource, bytes] = {}
        self._scopes: dict[InstrumentationScope | None, bytes] = {}

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        """Each attribute as one `tag` field (a KeyValue), from the tag's caches
        (`otlp_attributes.attributes`), encoded and kept by `_miss` where they miss."""
        if not attributes:
            return b""
        tagged = self._tagged.get(tag)
        if tagged is None:
            tagged = self._tagged[tag] = ({}, {}, {})
        strings, doubles, ints = tagged
        encoded: bytes = _attributes(
            self._read.items(attributes),
            strings,
            doubles,
            ints,
            self._miss,
            self._other,
            tagged,
            tag,
        )
        return encoded

    def _other(self, tag: bytes, key: str, value: Any) -> bytes:
        """An attribute of a kind never kept (a negative or huge int, a list, bytes, ...):
        encoded each time; b"" when it cannot be (logged and skipped, as the SDK does)."""
        try:
            pair = self._key(key) + _field(b"\x12", _value(value))
        except TypeError as error:  # the SDK's encoder logs and skips these too
            logger.warning("OTLP: attribute %s not exported: %s", key, error)
            return b""
        return _field(tag, pair)

    def _miss(self, tagged: _Tagged, tag: bytes, key: str, value: Any) -> bytes:
        """An attribute not in the tag's caches yet: encoded, and kept unless it is a tuple
        holding anything but strings (a tuple of ints could equal one of bools)."""
        strings, doubles, ints = tagged
        if isinstance(value, str | bool | tuple):
            encoded = _field(tag, _key_value(key, value))
            if key in _UNIQUE or (type(value) is tuple and not all(type(v) is str for v in value)):
                return encoded
            return _keep(strings, (key, value), encoded)
        if isinstance(value, float):
            return _keep(doubles, key, self._head(tag, key, 0x21, 8)) + _double(value)
        payload = _varint(value)
        size = len(payload)
        return _keep(ints, (key, size), self._head(tag, key, 0x18, size)) + payload

    def _key(self, key: str) -> bytes:
        """The KeyValue's key field."""
        name = self._keys.get(key)
        if name is None:
            name = _keep(self._keys, key, _field(b"\x0a", key.encode()))
        return name

    def _head(self, tag: bytes, key: str, number: int, size: int) -> bytes:
        """Everything of a `tag` KeyValue field before a number's `size` payload bytes: the
        key, and the AnyValue's length and type byte `number` (0x21 double, 0x18 int)."""
        pair = self._key(key) + b"\x12" + _BYTE[size + 1] + _BYTE[number]
        return tag + _varint(len(pair) + size) + pair

    def _event(self, name: str) -> tuple[bytes, bytes]:
        """A span event with no attributes: its field up to the time, and its name field."""
        around = self._events.get(name)
        if around is None:
            name_field = _string(b"\x12", name)
            head = b"\x5a" + _varint(9 + len(name_field)) + b"\x09"
            around = _keep(self._events, name, (head, name_field))
        return around

    def resource(self, resource: Resource) -> bytes:
        encoded = self._resources.get(resource)
        if encoded is None:
            encoded = self._resources[resource] = _field(
                b"\x0a", self.attributes(b"\x0a", resource.attributes)
            )
        return encoded

    def scope(self, scope: InstrumentationScope | None) -> bytes:
        encoded = self._scopes.get(scope)
        if encoded is None:
            body = b""
            if scope is not None:
                body = _string(b"\x0a", scope.name) + _string(b"\x12", scope.version)
                body += self.attributes(b"\x1a", scope.attributes)
            encoded = self._scopes[scope] = _field(b"\x0a", body)
        return encoded

    def span(self, span: ReadableSpan) -> bytes:
        return self.write(*self._read.span(span))

    def write(
        self,
        context: Any,
        parent: Any,
        name: str,
        kind: SpanKind,
        start_time: int | None,
        end_time: int | None,
        attributes: Mapping[str, Any] | None,
        dropped_attributes: int,
        events: Sequence[Event | tuple[str, int]],
        dropped_events: int,
        links: Sequence[Link],
        dropped_links: int,
        status: Status,
    ) -> bytes:
        """One `Span` field (ScopeSpans.spans) from a span's parts; an event is an SDK
        `Event` or, without attributes, a (name, time) pair."""
        assert context is not None
        parts = [
            b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + context.span_id.to_bytes(8, "big"),
        ]
        if context.trace_state:
            state = ",".join(f"{k}={v}" for k, v in context.trace_state.items())
            parts.append(_string(b"\x1a", state))
        if parent:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        name_field = self._names.get(name)
        if name_field is None:
            name_field = _keep(self._names, name, _string(b"\x2a", name))
        parts.append(name_field)
        parts.append(_KINDS[kind._value_])  # by value: an Enum hashes in Python (`__hash__`)
        if start_time:
            parts.append(b"\x39" + _fixed64(start_time))
        if end_time:
            parts.append(b"\x41" + _fixed64(end_time))
        parts.append(self.attributes(b"\x4a", attributes))
        if dropped_attributes:
            parts.append(b"\x50" + _varint(dropped_attributes))
        for event in events:
            if type(event) is tuple:  # a name and a time: direct spans' own events
                head, name_field = self._event(event[0])
                parts.append(head + _fixed64(event[1]) + name_field)
                continue
            event_name, timestamp, attributes, dropped = self._read.event(event)  # type: ignore[arg-type]
            if not attributes and not dropped:  # a name and a time, as sidestream's events
                head, name_field = self._event(event_name)
                parts.append(head + _fixed64(timestamp) + name_field)
                continue
            body = b"\x09" + _fixed64(timestamp) + _string(b"\x12", event_name)
            body += self.attributes(b"\x1a", attributes)
            if dropped:
                body += b"\x20" + _varint(dropped)
            parts.append(_field(b"\x5a", body))
        if dropped_events:
            parts.append(b"\x60" + _varint(dropped_events))
        for link in links:
            linked = link.context
            body = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big")
            body += b"\x12\x08" + linked.span_id.to_bytes(8, "big")
            body += self.attributes(b"\x22", link.attributes)
            if link.dropped_attributes:
                body += b"\x28" + _varint(link.dropped_attributes)
            body += b"\x35" + _fixed32(_flags(linked))
            parts.append(_field(b"\x6a", body))
        if dropped_links:
            parts.append(b"\x70" + _varint(dropped_links))
        code: int = status.status_code._value_  # by value, as the kind above
        description = status.description
        encoded = self._statuses.get((code, description))
        if encoded is None:
            body = _string(b"\x12", description) + (b"\x18" + _varint(code) if code else b"")
            encoded = _keep(self._statuses, (code, description), _field(b"\x7a", body))
        parts.append(encoded)
        parts.append(b"\x85\x01" + _fixed32(_flags(parent)))
        return _field(b"\x12", b"".join(parts))

    def request(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> bytes:
        """An ExportTraceServiceRequest: spans grouped by resource, then by scope."""
        grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
        last: tuple[Any, Any] = (_NOTHING, _NOTHING)
        encoded: list[bytes] = []
        for span in spans:
            # A provider's spans share its Resource and scope objects: each is looked up
            # (hashed: Resource's hash writes its attributes as JSON) once per run of spans.
            resource, scope = span.resource, span.instrumentation_scope or None
            if resource is not last[0] or scope is not last[1]:
                encoded = grouped.setdefault(resource, {}).setdefault(scope, [])
                last = (resource, scope)
            encoded.append(span.data if isinstance(span, EncodedSpan) else self.span(span))
        out = []
        for resource, scopes in grouped.items():
            body = [self.resource(resource)]
            for scope, encoded in scopes.items():
                scope_spans = self.scope(scope) + b"".join(encoded)
                if scope is not None and scope.schema_url:
                    scope_spans += _string(b"\x1a", scope.schema_url)
                body.append(_field(b"\x12", scope_spans))
            body.append(_string(b"\x1a", resource.schema_url))
            out.append(_field(b"\x0a", b"".join(body)))
        return b"".join(out)


_KINDS = {kind._value_: b"\x30" + _varint(number) for kind, number in _KIND.items()}


class EncodedSpan:
    """A finished span already written as its OTLP `Span` field (`data`), which the
    exporter here joins as it is: what `direct.DirectSpans` hands a
    BatchSpanProcessor in front of this module's exporter instead of a `ReadableSpan` (the
    processor reads `context` only, to skip unsampled spans; the exporter groups by
    `resource` and `instrumentation_scope`)."""

    __slots__ = ("context", "data", "instrumentation_scope", "resource")

    def __init__(
        self, context: Any, data: bytes, resource: Resource, scope: InstrumentationScope
    ) -> None:
        self.context = context
        self.data = data
        self.resource = resource
        self.instrumentation_scope = scope


def _flags(parent: Any) -> int:
    if parent is not None and parent.is_remote:
        return _HAS_IS_REMOTE | _IS_REMOTE
    return _HAS_IS_REMOTE


def encode_spans(spans: Sequence[ReadableSpan], encoder: Encoder | None = None) -> bytes:
    """`spans` as a serialized OTLP ExportTraceServiceRequest."""
    return (encoder or Encoder()).request(spans)
