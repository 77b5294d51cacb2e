"""Direct spans (`middleware.telemetry.direct`) against SDK spans: the same streams give the
same span — name, kind, parent, flags, attributes, events, status, resource, scope — and the
SDK's own exporters take them; sampling and span limits are the SDK's.

`tests/sockets/test_telemetry.py` runs all its span tests in both modes; this module compares the
two modes span for span and covers what only the direct path does for itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
    set_span_in_context,
)

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry, semconv
from middleware.telemetry.direct import DirectSpans
from middleware.telemetry.otlp import encode_spans
from tests.support import clients
from tests.support.apps import DONE, ROLE, chunk, scripted
from tests.support.servers import serve

STREAM = [(0, ROLE), (0, chunk("a")), (0.01, chunk("b")), (0, DONE)]
BODY = b'{"model": "m1", "stream": true, "max_tokens": 7, "temperature": 0.5}'
# Measured times and the listener's port: they differ from run to run, not between the two
# kinds of span.
VARYING = {
    semconv.SERVER_PORT,
    semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    semconv.GAP_P50,
    semconv.GAP_P99,
    semconv.GAP_MAX,
    semconv.TOKENS_PER_SECOND,
    semconv.CANCEL_LATENCY,
}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def telemetry(direct: bool, provider: TracerProvider | None = None) -> tuple[Telemetry, Any]:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    resource = Resource.create({"service.name": "parity"})
    if direct:
        made = Telemetry(span_processor=processor, tracer_provider=provider, resource=resource)
    else:
        provider = provider or TracerProvider(resource=resource)
        provider.add_span_processor(processor)
        made = Telemetry(tracer_provider=provider, resource=resource)
    return made, exporter


async def run(telemetry: Telemetry, app: Any, headers: Sequence[tuple[str, str]] = ()) -> None:
    async with serve(StreamGuard(app, telemetry=telemetry, idle_timeout=0.2)) as port:
        response = await clients.request(
            port, "POST", "/v1/chat/completions", body=BODY, headers=list(headers)
        )
        try:
            await response.body()
        finally:
            response.close()
        await asyncio.sleep(0.05)


def comparable(span: ReadableSpan) -> dict[str, Any]:
    """Everything of a span but its ids and times."""
    context, parent = span.context, span.parent
    assert context is not None
    events = []
    for event in span.events:
        attributes = dict(event.attributes or {})
        if semconv.EXCEPTION_STACKTRACE in attributes:
            attributes[semconv.EXCEPTION_STACKTRACE] = "..."  # line numbers of two call sites
        events.append((event.name, attributes))
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_flags": int(context.trace_flags),
        "trace_state": context.trace_state,
        "parent": None if parent is None else (parent.trace_id, parent.span_id, parent.is_remote),
        "attributes": {k: v for k, v in (span.attributes or {}).items() if k not in VARYING},
        "varying": sorted(k for k in (span.attributes or {}) if k in VARYING),
        "events": events,
        "status": (span.status.status_code, span.status.description),
        "resource": span.resource.attributes,
        "scope": span.instrumentation_scope,
        "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
    }


@pytest.mark.parametrize(
    "case", ["completed", "idle_timeout", "app_failure", "client_traceparent"], ids=str
)
async def test_a_direct_span_is_the_sdk_span(case: str) -> None:
    """The same stream makes the same span either way: a completed one, one cut by the idle
    timeout (error status, exception event), one whose app failed mid-stream, and one whose
    client sent a traceparent (the span's parent, remote)."""
    script: list[Any] = list(STREAM)
    options: dict[str, Any] = {}
    headers: list[tuple[str, str]] = []
    if case == "idle_timeout":
        script = [(0, ROLE), (0, chunk("a")), (1.0, chunk("b")), (0, DONE)]
    elif case == "app_failure":
        script = [(0, ROLE), (0, chunk("a"))]
        options["fail_after"] = True
    elif case == "client_traceparent":
        headers = [("traceparent", TRACEPARENT), ("tracestate", "vendor=1")]
    found = {}
    for direct in (False, True):
        made, exporter = telemetry(direct)
        await run(made, scripted(script, **options), headers)
        (span,) = exporter.get_finished_spans()
        found[direct] = span
    ours, sdks = comparable(found[True]), comparable(found[False])
    for key in ours:
        assert ours[key] == sdks[key], key
    if case == "client_traceparent":
        assert found[True].context.trace_id == found[False].context.trace_id
    if case in ("idle_timeout", "app_failure"):
        assert found[True].events[-1].name == semconv.EVENT_EXCEPTION


async def test_repeated_trace_context_headers_are_read_as_one_list() -> None:
    """Two `tracestate` headers are one list (HTTP's rule for a repeated header, which W3C
    Trace Context follows): the span continues the client's trace with both entries."""
    made, exporter = telemetry(True)
    headers = [("traceparent", TRACEPARENT), ("tracestate", "a=1"), ("tracestate", "b=2")]
    await run(made, scripted(STREAM), headers)
    (span,) = exporter.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    assert dict(span.context.trace_state) == {"a": "1", "b": "2"}


async def test_exporters_take_direct_spans_as_they_take_sdk_spans() -> None:
    """A direct span is a `ReadableSpan`: the SDK's OTLP encoder takes it, and sidestream's
    encoder writes the same bytes the SDK's does."""
    made, exporter = telemetry(True)
    await run(made, scripted(STREAM))
    spans = exporter.get_finished_spans()
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == sdk_encode(spans)


async def test_the_samplers_decision_holds_and_the_context_still_propagates() -> None:
    """A sampler that drops the span (here ALWAYS_OFF; the same for a parent with the sampled
    flag off under the default parent-based sampler) exports nothing, yet the app still sees
    a current span context — not sampled — to propagate."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(get_current_span().get_span_context())
            await scripted(STREAM)(scope, receive, send)  # type: ignore[operator]

    made, exporter = telemetry(True, TracerProvider(sampler=ALWAYS_OFF))
    await run(made, app)
    assert exporter.get_finished_spans() == ()
    (context,) = seen
    assert context.is_valid and not context.trace_flags.sampled
    made, exporter = telemetry(True)
    unsampled = TRACEPARENT[:-2] + "00"
    await run(made, app, [("traceparent", unsampled)])
    assert exporter.get_finished_spans() == ()
    assert format(seen[1].trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert not seen[1].trace_flags.sampled


async def test_span_limits_from_the_environment_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT and OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT bound a
    direct span as they bound an SDK span: extra attributes dropped (and counted), long
    values cut."""
    made, exporter = telemetry(True)
    await run(made, scripted(STREAM))
    (whole,) = exporter.get_finished_spans()
    count = len(whole.attributes or {})
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", str(count - 3))
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    made, exporter = telemetry(True)
    await run(made, scripted(STREAM))
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert len(attributes) == count - 3 and span.dropped_attributes == 3
    cut = [v for v in attributes.values() if isinstance(v, str)]
    assert cut and all(len(v) <= 4 for v in cut)


def test_a_direct_span_keeps_its_kind() -> None:
    """The span kind given to Telemetry is the direct spans' kind (CLIENT in the sidecar)."""
    made = Telemetry(
        span_processor=SimpleSpanProcessor(InMemorySpanExporter()), span_kind=SpanKind.CLIENT
    )
    assert made.direct is not None and made.direct.kind is SpanKind.CLIENT
    assert made.tracer is None


class FixedIds(RandomIdGenerator):
    """The same trace id every time (ratio samplers decide by it), random span ids."""

    def __init__(self, trace_id: int) -> None:
        self.trace_id = trace_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class Tagging(Sampler):
    """A sampler of its own: samples, adds an attribute and a trace state entry."""

    def should_sample(self, parent_context: Any, *args: Any, **kwargs: Any) -> SamplingResult:
        state = TraceState([("tagging", "1")])
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampled.by": "tagging"}, state)

    def get_description(self) -> str:
        return "Tagging"


SAMPLERS = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": ParentBased(ALWAYS_ON),
    "parentbased_always_off": ParentBased(ALWAYS_OFF),
    "ratio": TraceIdRatioBased(0.5),
    "parentbased_ratio": ParentBased(TraceIdRatioBased(0.5)),
    "parentbased_delegates": ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON),
    "own": Tagging(),
}
PARENTS = {
    "none": None,
    "remote_sampled": (True, 1, TraceState([("vendor", "x")])),
    "remote_unsampled": (True, 0, None),
    "local_sampled": (False, 1, None),
    "local_unsampled": (False, 0, TraceState([("vendor", "y")])),
}


@pytest.mark.parametrize("trace_id", [1, 2**127 - 1], ids=["low", "high"])
@pytest.mark.parametrize("parent", PARENTS, ids=str)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=str)
def test_a_direct_span_is_sampled_as_the_sdk_samples(
    sampler: str, parent: str, trace_id: int
) -> None:
    """Whatever the sampler (the SDK's defaults, which direct spans decide themselves, or any
    other, asked per span) and the parent (none, remote or local, sampled or not, with trace
    state), a direct span gets the SDK span's decision: flags, trace state, recorded or not,
    and the sampler's attributes."""
    ids = FixedIds(trace_id)
    provider = TracerProvider(sampler=SAMPLERS[sampler], id_generator=ids)
    context = None
    if PARENTS[parent] is not None:
        remote, flags, state = PARENTS[parent]
        span_context = SpanContext(trace_id, 0x99, remote, TraceFlags(flags), state)
        context = set_span_in_context(NonRecordingSpan(span_context))
    attributes = {"http.request.method": "POST"}
    sdk = provider.get_tracer("t").start_span("chat", context=context, attributes=attributes)
    direct = DirectSpans(provider, SimpleSpanProcessor(InMemorySpanExporter()), SpanKind.CLIENT)
    ours = direct.start("chat", context, dict(attributes), 1)
    expected = sdk.get_span_context()
    assert ours.context.trace_id == expected.trace_id
    assert ours.context.trace_flags == expected.trace_flags
    assert ours.context.trace_state == expected.trace_state
    assert (ours.attributes is not None) == sdk.is_recording()
    if sdk.is_recording():
        assert ours.attributes == dict(sdk.attributes or {})


class Recording:
    """An OTLP exporter's HTTP client that keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def export(self, data: bytes) -> Any:
        self.sent.append(data)
        return type("Result", (), {"success": True})()

    def shutdown(self) -> None:
        pass


class OneSpanId(FixedIds):
    """The same trace and span ids every time."""

    def generate_span_id(self) -> int:
        return 0x5678


def spy(exporter: Any, into: list[Any]) -> None:
    """Keep what `exporter.export` is given in `into`."""
    export = exporter.export

    def spied(spans: Sequence[Any]) -> Any:
        into.extend(spans)
        return export(spans)

    exporter.export = spied


@pytest.mark.parametrize("case", ["plain", "events", "exception", "remote_parent"], ids=str)
def test_a_span_written_at_its_end_is_the_readable_span_encoded(case: str) -> None:
    """In front of sidestream's OTLP exporter a direct span is written in OTLP at its end
    (`EncodedSpan`), not handed over as a ReadableSpan: the exported request is byte for byte
    what the ReadableSpan path sends, with and without events, an exception event and a
    remote parent, and the official classes parse it."""
    from middleware.telemetry.direct import exception_event
    from middleware.telemetry.otlp import EncodedSpan, OTLPSpanExporter

    resource = Resource.create({"service.name": "parity"})
    context = None
    if case == "remote_parent":
        parent = SpanContext(0xABC, 0x99, True, TraceFlags(1), TraceState([("v", "1")]))
        context = set_span_in_context(NonRecordingSpan(parent))
    sent: list[bytes] = []
    handed: list[Any] = []
    for encoded in (True, False):
        handed_to_exporter: list[Any] = []
        provider = TracerProvider(resource=resource, id_generator=OneSpanId(0x1234))
        exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
        recording = exporter._client = Recording()  # type: ignore[assignment]
        spy(exporter, handed_to_exporter)
        if not encoded:
            exporter_in_memory = InMemorySpanExporter()
            direct = DirectSpans(provider, SimpleSpanProcessor(exporter_in_memory), SpanKind.CLIENT)
            assert direct.encoder is None
        else:
            direct = DirectSpans(provider, SimpleSpanProcessor(exporter), SpanKind.CLIENT)
            assert direct.encoder is not None
        span = direct.start("chat", context, {"http.request.method": "POST", "n": 1}, 1_000)
        events = [] if case == "plain" else [("gen_ai.first_chunk", 1_500), ("done", 1_900)]
        error = None
        if case == "exception":
            try:
                raise TimeoutError("idle")
            except TimeoutError as exc:
                error = exception_event(exc, 1_950, escaped=False)
        attributes = {"gen_ai.request.model": "m", "ttft": 0.5, "reasons": ("stop",), "s": True}
        status = Status(StatusCode.ERROR, "idle_timeout") if error else Status(StatusCode.UNSET)
        direct.end(span, "chat m", attributes, events, error, status, 2_000)
        if not encoded:
            (readable,) = exporter_in_memory.get_finished_spans()
            exporter.export([readable])
        (data,) = recording.sent
        sent.append(data)
        handed.append(type(handed_to_exporter[-1]) if handed_to_exporter else None)
    assert handed[0] is EncodedSpan
    assert sent[0] == sent[1]
    request = ExportTraceServiceRequest.FromString(sent[0])
    (message,) = request.resource_spans[0].scope_spans[0].spans
    assert message.name == "chat m"
    assert len(message.events) == {"plain": 0, "exception": 3}.get(case, 2)
