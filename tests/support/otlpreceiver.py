"""An OTLP/HTTP trace receiver for tests: a small ASGI app (serve it with
`tests.support.servers.serve`) that decodes `ExportTraceServiceRequest` with
opentelemetry-proto, the protocol Jaeger ingests on port 4318."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from middleware.types import Receive, Scope, Send


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
