"""Telemetry over the real wire: spans exported over OTLP/HTTP to a real receiver, and the
W3C trace context the sidecar sends upstream.

The receiver is a small ASGI app under uvicorn that decodes `ExportTraceServiceRequest`
with opentelemetry-proto: the protocol Jaeger ingests on port 4318.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import requests
from hypothesis import given, settings
from opentelemetry import baggage as otel_baggage
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator, default_setter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry, otel_sdk, semconv
from middleware.telemetry.otlp import OTLPSpanExporter, encode_spans, plain_http_transport
from middleware.telemetry.otlp_encoder import Encoder
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.tracecontext import inject_trace_context
from sidecar.upstream.types import Upstream
from tests.support import clients
from tests.support.otlpreceiver import Receiver, attributes
from tests.support.servers import serve
from tests.support.upstreams import EchoUpstream, header


def spans_to(processor: SpanProcessor, direct: bool) -> Telemetry:
    """The sidecar's telemetry (span kind CLIENT) with direct spans or the SDK's."""
    if direct:
        return Telemetry(span_processor=processor, span_kind=SpanKind.CLIENT)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return Telemetry(tracer_provider=provider, span_kind=SpanKind.CLIENT)


@contextlib.asynccontextmanager
async def sidecar(telemetry: Telemetry, upstream: Any, **guard: Any) -> AsyncIterator[int]:
    async with serve(upstream) as upstream_port:
        proxy = ProxyApp(Upstream.parse(f"http://127.0.0.1:{upstream_port}"))
        try:
            async with serve(StreamGuard(proxy, telemetry=telemetry, **guard), "sidecar") as port:
                yield port
        finally:
            await proxy.aclose()


def body(tokens: int, ttft_ms: int, itl_ms: int) -> bytes:
    return json.dumps(
        {
            "model": "m1",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "sidestream": {"tokens": tokens, "ttft_ms": ttft_ms, "itl_ms": itl_ms},
        }
    ).encode()


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment where nothing but the endpoint decides how spans are sent: no proxy,
    no credential provider, no netrc file (a home of its own)."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", raising=False)
    monkeypatch.delenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_plain_http_endpoints_are_sent_through_urllib3_and_others_as_the_sdk_sends(
    plain_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's urllib3 transport is taken only where `requests` (the SDK's default) would
    send the same: a plain-HTTP endpoint, given or from OTEL_EXPORTER_OTLP_*ENDPOINT, with
    no proxy, credential provider or netrc file. TLS endpoints, proxies, credential
    providers, a netrc file and a session of the caller's keep the default."""
    http = "http://127.0.0.1:4318/v1/traces"
    assert type(plain_http_transport(http)) is Urllib3HTTPTransport
    assert type(plain_http_transport(None)) is Urllib3HTTPTransport  # the SDK's default endpoint
    assert plain_http_transport("https://collector:4318/v1/traces") is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")
    assert plain_http_transport(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")
    assert type(plain_http_transport(None)) is Urllib3HTTPTransport
    for name, setting in [
        ("HTTP_PROXY", "http://proxy:3128"),
        ("all_proxy", "http://proxy:3128"),
        ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "vault"),
        ("NETRC", str(tmp_path / "netrc")),
    ]:
        assert plain_http_transport(http, {name: setting}) is None, name
    (tmp_path / ".netrc").write_text("machine collector login a password b\n")
    assert plain_http_transport(http) is None
    exporter = OTLPSpanExporter(endpoint=http)
    assert type(exporter._client._transport) is not Urllib3HTTPTransport
    (tmp_path / ".netrc").unlink()
    assert type(OTLPSpanExporter(endpoint=http)._client._transport) is Urllib3HTTPTransport
    own = OTLPSpanExporter(endpoint=http, session=requests.Session())
    assert type(own._client._transport) is not Urllib3HTTPTransport


@pytest.mark.parametrize("transport", ["urllib3", "requests"])
async def test_either_transport_delivers_a_batch(
    transport: str, plain_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through urllib3 (a plain-HTTP endpoint) or the SDK's requests (here because a netrc
    file is named), a batch of spans reaches a real receiver whole."""
    if transport == "requests":
        (tmp_path / "netrc").write_text("")
        monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    receiver = Receiver()
    spans = sdk_spans([{"a": "x"}, {"b": 1}], remote_parent=False)
    async with serve(receiver) as otlp_port:
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces")
        used = type(exporter._client._transport)
        assert (used is Urllib3HTTPTransport) == (transport == "urllib3")
        result = await asyncio.to_thread(exporter.export, spans)
        exporter.shutdown()
    assert result == SpanExportResult.SUCCESS
    assert sorted(s.name for s in receiver.spans) == sorted(s.name for s in spans)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sdk"])
async def test_spans_arrive_over_otlp_http_with_their_attributes(
    direct: bool, plain_env: None
) -> None:
    """A completed, a cancelled and a timed-out stream reach a real OTLP/HTTP receiver as
    protobuf, one span each, with kind CLIENT, the outcome, GenAI usage and error status.
    The exporter is sidestream's (the SDK's, with the fast encoder), on its fast path and
    the urllib3 transport; the spans are direct ones (as the sidecar makes them) or the
    SDK's."""
    receiver = Receiver()
    async with serve(receiver) as otlp_port:
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces")
        assert exporter.fast, "the installed SDK's exporter layout changed: fast path lost"
        assert type(exporter._client._transport) is Urllib3HTTPTransport
        telemetry = spans_to(BatchSpanProcessor(exporter), direct)
        provider = telemetry.tracer_provider
        assert provider is not None
        async with sidecar(telemetry, make_app(stats=Stats()), first_token_timeout=0.3) as port:
            path = "/v1/chat/completions"
            done = await clients.request(port, "POST", path, body=body(10, 0, 1))
            await done.body()
            done.close()
            left = await clients.request(port, "POST", path, body=body(500, 0, 10))
            while b'"content":"' not in (await left.chunk() or b""):
                pass
            left.close()
            slow = await clients.request(port, "POST", path, body=body(5, 3000, 1))
            await slow.body()
            slow.close()
            await asyncio.sleep(0.3)  # the cancelled stream's span ends server-side
        await asyncio.to_thread(provider.force_flush)
        await asyncio.to_thread(provider.shutdown)
    assert set(receiver.content_types) == {"application/x-protobuf"}
    by_outcome = {attributes(s)[semconv.OUTCOME]: s for s in receiver.spans}
    assert set(by_outcome) == {"completed", "client_disconnected", "first_token_timeout"}
    completed = by_outcome["completed"]
    a = attributes(completed)
    assert completed.name == "chat m1"
    assert completed.kind == ProtoSpan.SPAN_KIND_CLIENT
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 10
    assert a[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert a[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert [e.name for e in completed.events] == [
        semconv.EVENT_FIRST_CHUNK,
        semconv.EVENT_UPSTREAM_DONE,
    ]
    assert completed.status.code == completed.status.STATUS_CODE_UNSET
    left_span = by_outcome["client_disconnected"]
    assert left_span.status.code == left_span.status.STATUS_CODE_UNSET
    assert attributes(left_span)[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["error"]
    assert attributes(left_span)[semconv.CANCEL_LATENCY] >= 0
    timed_out = by_outcome["first_token_timeout"]
    assert timed_out.status.code == timed_out.status.STATUS_CODE_ERROR
    assert "exception" in [e.name for e in timed_out.events]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sdk"])
async def test_upstream_sees_the_sidecar_span_as_parent(direct: bool) -> None:
    """The sidecar injects its own span context upstream: the upstream's traceparent has the
    span's trace id and the span's id as parent id; the span itself is the child of the
    client's traceparent, which does not reach the upstream."""
    exporter = InMemorySpanExporter()
    telemetry = spans_to(SimpleSpanProcessor(exporter), direct)
    echo = EchoUpstream()
    inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with sidecar(telemetry, echo) as port:
        response = await clients.request(
            port,
            "POST",
            "/v1/chat/completions",
            body=b'{"model": "m1"}',
            headers=[("traceparent", inbound), ("tracestate", "vendor=1")],
        )
        await response.body()
        response.close()
        for _ in range(100):
            if exporter.get_finished_spans():
                break
            await asyncio.sleep(0.01)
    (span,) = exporter.get_finished_spans()
    (seen,) = header(echo.seen[0], "traceparent")
    version, trace_id, parent_id, flags = seen.split("-")
    assert version == "00" and flags == "01"
    assert trace_id == format(span.context.trace_id, "032x") == inbound.split("-")[1]
    assert parent_id == format(span.context.span_id, "016x")
    assert span.parent is not None and format(span.parent.span_id, "016x") == inbound.split("-")[2]
    assert header(echo.seen[0], "tracestate") == ["vendor=1"]  # carried in the span context


async def test_without_telemetry_the_clients_traceparent_passes_through() -> None:
    """Telemetry off: the proxy adds no trace context and forwards the client's unchanged."""
    echo = EchoUpstream()
    inbound = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with serve(echo) as upstream_port:
        proxy = ProxyApp(Upstream.parse(f"http://127.0.0.1:{upstream_port}"))
        try:
            async with serve(StreamGuard(proxy)) as port:
                response = await clients.request(
                    port, "GET", "/v1/models", headers=[("traceparent", inbound)]
                )
                await response.body()
                response.close()
        finally:
            await proxy.aclose()
    assert header(echo.seen[0], "traceparent") == [inbound]


# --- the trace context sent upstream ------------------------------------------------------------

CLIENT_HEADERS = [
    (b"host", b"up"),
    (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    (b"tracestate", b"client=1"),
    (b"baggage", b"client=1"),
    (b"x-keep", b"1"),
]


def propagated(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` as the global propagator's own inject would leave them: its fields (and the
    client's traceparent and tracestate) replaced by what it writes for the current context."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    drop = {k.encode() for k in carrier} | {b"traceparent", b"tracestate"}
    kept = [(k, v) for k, v in headers if k not in drop]
    return kept + [(k.encode(), v.encode()) for k, v in carrier.items()]


@pytest.mark.parametrize("state", [None, TraceState([("vendor", "a=b"), ("other", "1")])])
@pytest.mark.parametrize("flags", [0, 1])
@pytest.mark.parametrize("with_baggage", [False, True])
@pytest.mark.parametrize("client_trace", [True, False], ids=["client-trace", "no-client-trace"])
def test_the_upstream_gets_the_trace_context_the_propagator_writes(
    state: TraceState | None, flags: int, with_baggage: bool, client_trace: bool
) -> None:
    """With the default propagation, traceparent and tracestate are written as the W3C
    propagator writes them (replacing the client's where it sent them, other headers kept
    in their order); with baggage in the context, the baggage header too."""
    span = NonRecordingSpan(
        SpanContext(
            0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(flags), trace_state=state
        )
    )
    ctx = set_span_in_context(span)
    if with_baggage:
        ctx = otel_baggage.set_baggage("tenant", "a b", ctx)
    token = otel_context.attach(ctx)
    try:
        client = [h for h in CLIENT_HEADERS if client_trace or not h[0].startswith(b"trace")]
        headers = list(client)
        inject_trace_context(headers)
        expected = propagated(client)
    finally:
        otel_context.detach(token)
    assert headers == expected
    assert (b"traceparent", b"00-%032x-%016x-%02x" % (0x1234, 0x5678, flags)) in headers
    assert any(k == b"baggage" and b"tenant" in v for k, v in headers) == with_baggage


class VendorPropagator(TextMapPropagator):
    """A propagator of another format: `x-vendor-trace` only."""

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    def inject(self, carrier: Any, context: Any = None, setter: Any = default_setter) -> None:
        span_context = get_current_span(context).get_span_context()
        setter.set(carrier, "x-vendor-trace", f"{span_context.trace_id:x}")

    @property
    def fields(self) -> set[str]:
        return {"x-vendor-trace"}


def test_another_propagator_writes_its_own_headers() -> None:
    """When OTEL_PROPAGATORS (or set_global_textmap) names another propagator, it writes the
    upstream's trace headers, not sidestream's W3C shortcut."""
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(VendorPropagator())
    token = otel_context.attach(
        set_span_in_context(NonRecordingSpan(SpanContext(0xAB, 0xCD, False)))
    )
    try:
        headers = list(CLIENT_HEADERS)
        inject_trace_context(headers)
    finally:
        otel_context.detach(token)
        propagate.set_global_textmap(before)
    assert (b"x-vendor-trace", b"ab") in headers
    assert not any(k == b"traceparent" for k, _ in headers)


def test_without_a_current_span_the_headers_are_left_as_they_are() -> None:
    """Telemetry off (no current span): the client's trace headers go upstream unchanged."""
    headers = list(CLIENT_HEADERS)
    inject_trace_context(headers)
    assert headers == CLIENT_HEADERS


# --- the fast encoder writes exactly what the SDK's encoder writes ---------------------------

scalars = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
values = st.one_of(
    scalars,
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3).map(tuple),
    st.lists(st.floats(allow_nan=False), max_size=3).map(tuple),
    st.lists(st.booleans(), max_size=3).map(tuple),
)
attribute_sets = st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=8)


def sdk_spans(attrs: list[dict[str, Any]], remote_parent: bool) -> list[Any]:
    """Finished SDK spans covering every field the encoder writes: two resources and two
    scopes, a remote and a local parent, trace state, events, links, error status."""
    exported = InMemorySpanExporter()
    spans = []
    for i, resource in enumerate([Resource.create({"service.name": "a"}), Resource({"r": 1})]):
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(exported))
        for scope in ("sidestream", "other"):
            tracer = provider.get_tracer(scope, "1.0", schema_url="https://x/1" if i else None)
            parent = SpanContext(
                0x1234 + i,
                0x99,
                is_remote=remote_parent,
                trace_flags=TraceFlags(1),
                trace_state=TraceState([("k", "v")]) if i else None,
            )
            ctx = set_span_in_context(NonRecordingSpan(parent))
            link = Link(SpanContext(7, 8, is_remote=True), attributes=attrs[0])
            span = tracer.start_span(
                f"chat {scope}",
                context=ctx if i else None,
                kind=SpanKind.CLIENT if i else SpanKind.SERVER,
                attributes=attrs[0],
                links=[link] if i else [],
                start_time=1_700_000_000_000_000_000,
            )
            span.set_attributes(attrs[1])
            span.add_event("gen_ai.first_chunk", attrs[1], timestamp=1_700_000_000_100_000_000)
            if i:
                span.set_status(Status(StatusCode.ERROR, "idle_timeout"))
            span.end(end_time=1_700_000_001_000_000_000)
            spans.append(span)
    return list(exported.get_finished_spans())


@settings(max_examples=60, deadline=None)
@given(st.lists(attribute_sets, min_size=2, max_size=2), st.booleans())
def test_the_fast_encoder_writes_what_the_sdk_encoder_writes(
    attrs: list[dict[str, Any]], remote_parent: bool
) -> None:
    """Parsed with the official classes, the fast encoder's request equals the SDK's for
    spans with every attribute type, events, links, parents, trace state and status."""
    spans = sdk_spans(attrs, remote_parent)
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == sdk_encode(spans)


def test_spans_over_their_limits_are_written_with_their_dropped_counts() -> None:
    """Spans the SDK bounded (attributes, events, links and event attributes over their
    limits) carry dropped counts, read from the SDK's own bounded types: written as the
    SDK writes them."""
    exported = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=2, max_events=1, max_links=1, max_event_attributes=1)
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    links = [Link(SpanContext(7, 8, is_remote=True), {"a": 1, "b": 2}) for _ in range(3)]
    span = provider.get_tracer("t").start_span("s", attributes={"a": 1, "b": 2}, links=links)
    span.set_attributes({"c": "x", "d": 0.5})
    for _ in range(3):
        span.add_event("e", {"k": 1, "l": 2})
    span.end()
    spans = list(exported.get_finished_spans())
    assert spans[0].dropped_attributes and spans[0].dropped_events and spans[0].dropped_links
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == sdk_encode(spans)
    assert ours.resource_spans[0].scope_spans[0].spans[0].dropped_attributes_count == 2


class OtherSpan(ReadableSpan):
    """A ReadableSpan of another class, with properties of its own."""

    @property
    def name(self) -> str:
        return "other " + self._name


def test_spans_of_other_classes_are_read_through_their_public_api() -> None:
    """Only the SDK's own span classes are read from their fields; a span of any other class
    (here one overriding `name`) is encoded from what its properties return."""
    base = sdk_spans([{"a": "x"}, {"b": 2}], remote_parent=True)
    spans: list[ReadableSpan] = [
        OtherSpan(
            s.name,
            context=s.get_span_context(),
            parent=s.parent,
            resource=s.resource,
            attributes=s.attributes,
            events=s.events,
            links=s.links,
            kind=s.kind,
            status=s.status,
            start_time=s.start_time,
            end_time=s.end_time,
            instrumentation_scope=s.instrumentation_scope,
        )
        for s in base
    ]
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == sdk_encode(spans)
    assert all(s.name.startswith("other ") for r in ours.resource_spans
               for ss in r.scope_spans for s in ss.spans)  # fmt: skip


def test_spans_of_one_resource_apart_in_a_batch_are_grouped_as_the_sdk_groups_them() -> None:
    """Spans are grouped by resource and scope (equal ones together, in the order first
    seen) even when spans of other resources and scopes come between them."""
    spans = sdk_spans([{"a": "x"}, {"b": 2}], remote_parent=False)
    mixed = spans[::2] + spans[1::2] + spans[:1]
    assert len({id(s.resource) for s in mixed}) == 2
    ours = ExportTraceServiceRequest.FromString(encode_spans(mixed))
    assert ours == sdk_encode(mixed)
    assert len(ours.resource_spans) == 2


def test_the_fast_encoder_repeats_itself_from_its_caches() -> None:
    """Strings, resources and scopes come from the encoder's caches on the second batch:
    the bytes are the same as the first time."""
    from middleware.telemetry.otlp_encoder import Encoder

    spans = sdk_spans([{"a": "x", "b": 1}, {"c": "y"}], remote_parent=True)
    encoder = Encoder()
    first = encoder.request(spans)
    assert encoder.request(spans) == first == encode_spans(spans)


def test_response_ids_are_written_but_not_kept() -> None:
    """A response id is new with every span: the encoder writes it as the SDK does but does
    not keep it, so spans by the thousand leave its string cache as small as one span."""
    from middleware.telemetry.otlp_encoder import Encoder

    encoder = Encoder()
    for n in range(50):
        spans = sdk_spans([{"a": "x"}, {semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{n}"}], False)
        ours = ExportTraceServiceRequest.FromString(encoder.request(spans))
        assert ours == sdk_encode(spans)
    assert not any(key == semconv.GEN_AI_RESPONSE_ID for key, _ in encoder._tagged[b"\x4a"][0])


def test_one_key_holding_a_float_then_an_int_of_the_same_size_is_written_as_each() -> None:
    """The encoder caches what precedes a number's bytes per key and size; a double and an
    int of 8 varint bytes are both 9-byte values, so the cache tells them apart by type:
    one encoder writing both, for the same key, still writes what the SDK writes. So too
    for values Python finds equal (a flag and an int, tuples of them) under one key."""
    from middleware.telemetry.otlp_encoder import Encoder

    encoder = Encoder()
    # Equal in Python, not on the wire: 1 and True, (1,) and (True,), 1.0 and 1.
    for value in (0.7, 2**50, 0.25, 2**50 + 1, 5, 1, True, 1.0, (1,), (True,), ("a",), (1,)):
        spans = sdk_spans([{"k": value}, {"k": value}], remote_parent=False)
        ours = ExportTraceServiceRequest.FromString(encoder.request(spans))
        assert ours == sdk_encode(spans), value


@settings(max_examples=30, deadline=None)
@given(st.lists(attribute_sets, min_size=4, max_size=4))
def test_one_encoder_with_full_caches_still_writes_what_the_sdk_writes(
    batches: list[dict[str, Any]],
) -> None:
    """The encoder's caches (strings, number heads, keys) are emptied when full: with a
    limit of three entries, one encoder writing batch after batch of varied attributes —
    hits, misses and clears in turn — still writes what the SDK writes each time."""
    import middleware.telemetry.otlp_encoder as otlp

    encoder = otlp.Encoder()
    limit = otlp._CACHE_LIMIT
    otlp._CACHE_LIMIT = 3
    try:
        pairs = [[batches[i], batches[(i + 1) % 4]] for i in range(4)] + [[b, b] for b in batches]
        for attrs in pairs:
            spans = sdk_spans(attrs, remote_parent=False)
            ours = ExportTraceServiceRequest.FromString(encoder.request(spans))
            assert ours == sdk_encode(spans)
    finally:
        otlp._CACHE_LIMIT = limit


async def test_a_batch_the_fast_encoder_cannot_write_goes_out_through_the_sdks_encoder(
    monkeypatch: Any,
) -> None:
    """Never lose a batch to the encoder: when it raises, the exporter logs it and sends the
    batch with the SDK's own encoding; the receiver gets every span."""
    receiver = Receiver()
    async with serve(receiver) as otlp_port:
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces")

        def broken(spans: Any) -> bytes:
            raise ValueError("boom")

        monkeypatch.setattr(exporter._encoder, "request", broken)
        spans = sdk_spans([{"a": "x"}, {"b": 2}], remote_parent=False)
        result = await asyncio.to_thread(exporter.export, spans)
        exporter.shutdown()
    assert result.name == "SUCCESS"
    assert sorted(s.name for s in receiver.spans) == sorted(s.name for s in spans)


# --- the version gate (`otel_sdk`): private internals only on the versions checked ----------


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """As if the installed opentelemetry-sdk were a version `otel_sdk` was not checked
    against; the gate is decided afresh before and after."""
    versions = {**otel_sdk.installed(), "opentelemetry-sdk": "9.0.0"}
    monkeypatch.setattr(otel_sdk, "installed", lambda: versions)
    otel_sdk.checked.cache_clear()
    yield "opentelemetry-sdk 9.0.0"
    otel_sdk.checked.cache_clear()


def test_the_installed_opentelemetry_is_a_version_checked() -> None:
    """Pins the fast paths to the installed versions: after an upgrade this fails until the
    private reads in `otel_sdk` are checked again and the version added to CHECKED."""
    assert otel_sdk.checked(), otel_sdk.installed()


def test_an_unchecked_version_is_said_once_and_every_private_read_is_skipped(
    unchecked: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: with a version not checked, one warning names it, and the exporter, the
    transport, direct spans, metric exporters and the propagator all take the public path."""
    with caplog.at_level(logging.WARNING, logger="sidestream"):
        assert not otel_sdk.checked()
        assert not otel_sdk.checked()
    (warning,) = [r for r in caplog.records if "not a version" in r.getMessage()]
    assert unchecked in warning.getMessage()
    exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert not exporter.fast
    assert type(exporter._client._transport) is not Urllib3HTTPTransport
    assert plain_http_transport("http://127.0.0.1:9/v1/traces") is None
    telemetry = Telemetry(span_processor=SimpleSpanProcessor(InMemorySpanExporter()))
    assert telemetry.direct is None and telemetry.tracer is not None  # the SDK's spans
    assert otel_sdk.metric_preferences(exporter) == {}
    assert otel_sdk.propagators(propagate.get_global_textmap()) is None
    # The encoder reads spans through their public API then, and writes the same bytes.
    spans = sdk_spans([{"a": "x", "n": 1}, {"b": 2.5, "c": ("x", "y")}], remote_parent=True)
    from_fields = Encoder(otel_sdk.SpanReader(fields=True)).request(spans)
    assert encode_spans(spans) == from_fields


async def test_with_an_unchecked_version_sdk_spans_reach_the_receiver_through_the_sdks_exporter(
    unchecked: str, plain_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: the fallback is correct, only slower: `from_env` makes SDK spans, exported by
    the SDK's own OTLP exporter and encoder, and the receiver gets the same span."""
    receiver = Receiver()
    async with serve(receiver) as otlp_port:
        endpoint = f"http://127.0.0.1:{otlp_port}/v1/traces"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        telemetry = Telemetry.from_env(SpanKind.CLIENT)
        assert telemetry is not None and telemetry.direct is None
        provider = telemetry.tracer_provider
        assert provider is not None
        async with sidecar(telemetry, make_app(stats=Stats())) as port:
            done = await clients.request(port, "POST", "/v1/chat/completions", body=body(10, 0, 1))
            await done.body()
            done.close()
            await asyncio.sleep(0.1)
        await asyncio.to_thread(provider.force_flush)
        await asyncio.to_thread(provider.shutdown)
    assert set(receiver.content_types) == {"application/x-protobuf"}
    (span,) = receiver.spans
    a = attributes(span)
    assert span.name == "chat m1" and span.kind == ProtoSpan.SPAN_KIND_CLIENT
    assert a[semconv.OUTCOME] == "completed"
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 10
    assert a[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert [e.name for e in span.events] == [
        semconv.EVENT_FIRST_CHUNK,
        semconv.EVENT_UPSTREAM_DONE,
    ]


def test_with_an_unchecked_version_the_propagator_writes_the_upstreams_headers(
    unchecked: str,
) -> None:
    """Rule: without the gate the sidecar does not read a CompositePropagator's parts; the
    propagator itself writes the trace headers, the same ones."""
    from sidecar.tracecontext import _w3c_propagation

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    span = NonRecordingSpan(SpanContext(0x1234, 0x5678, False, TraceFlags(1)))
    token = otel_context.attach(set_span_in_context(span))
    try:
        assert not _w3c_propagation()
        headers = list(CLIENT_HEADERS)
        inject_trace_context(headers)
        expected = propagated(CLIENT_HEADERS)
    finally:
        otel_context.detach(token)
        propagate.set_global_textmap(before)
    assert headers == expected
    assert (b"traceparent", b"00-%032x-%016x-01" % (0x1234, 0x5678)) in headers
