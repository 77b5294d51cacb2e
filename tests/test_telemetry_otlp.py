"""Telemetry over the real wire: spans exported over OTLP/HTTP to a real receiver, and the
W3C trace context the sidecar sends upstream.

The receiver is a small ASGI app under uvicorn that decodes `ExportTraceServiceRequest`
with opentelemetry-proto: the protocol Jaeger ingests on port 4318.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from middleware import semconv
from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry
from middleware.types import Receive, Scope, Send
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.upstream import Upstream
from tests import clients
from tests.servers import serve
from tests.upstreams import EchoUpstream, header


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[ProtoSpan] = []
        self.content_types: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = dict(scope["headers"])
        self.content_types.append(headers.get(b"content-type", b"").decode())
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        await send(
            {
                "type": "http.response.start",
                "status": 200 if scope["path"] == "/v1/traces" else 404,
                "headers": [(b"content-type", b"application/x-protobuf")],
            }
        )
        await send({"type": "http.response.body", "body": reply})


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(span: ProtoSpan) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in span.attributes}


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


async def test_spans_arrive_over_otlp_http_with_their_attributes() -> None:
    """A completed, a cancelled and a timed-out stream reach a real OTLP/HTTP receiver as
    protobuf, one span each, with kind CLIENT, the outcome, GenAI usage and error status."""
    receiver = Receiver()
    async with serve(receiver) as otlp_port:
        provider = TracerProvider()
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        telemetry = Telemetry(tracer_provider=provider, span_kind=SpanKind.CLIENT)
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


async def test_upstream_sees_the_sidecar_span_as_parent() -> None:
    """The sidecar injects its own span context upstream: the upstream's traceparent has the
    span's trace id and the span's id as parent id; the span itself is the child of the
    client's traceparent, which does not reach the upstream."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(tracer_provider=provider, span_kind=SpanKind.CLIENT)
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
