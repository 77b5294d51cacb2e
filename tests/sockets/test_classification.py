"""Each request is reported as what it was (`middleware.telemetry.kinds`): a stream, a GenAI
call that did not stream, or other traffic.

The app is what an OpenAI-compatible server built on Starlette looks like (llama-cpp-python's
is one): CORS middleware, `GET /v1/models`, `POST /v1/chat/completions` streaming or not, 404
and 405 for the rest. Read back: the Prometheus text, the spans (direct and SDK), the access
lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, prometheus_text, semconv
from middleware.telemetry.sinks import ACCESS_ALL
from middleware.types import Receive, Scope, Send
from tests.support import clients
from tests.support.apps import DONE, ROLE, SSE_HEADERS, chunk
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop"}
        ],
        "usage": USAGE,
    }
).encode()
USAGE_CHUNK = b'data: {"id":"chatcmpl-1","choices":[],"usage":%s}\n\n' % json.dumps(USAGE).encode()


async def events() -> AsyncIterator[bytes]:
    for piece in (ROLE, chunk("a"), chunk("b"), USAGE_CHUNK, DONE):
        yield piece


async def chat(request: Request) -> Response:
    body = await request.json()
    status = request.headers.get("x-status")
    if status:  # the server's own error, as JSON
        error = {"error": {"message": "no", "type": "server_error"}}
        return JSONResponse(error, status_code=int(status))
    if body.get("stream"):
        return StreamingResponse(events(), media_type="text/event-stream")
    return Response(COMPLETION, media_type="application/json")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})


def server() -> Starlette:
    """An OpenAI-compatible server as Starlette apps are written, CORS open to every origin."""
    cors = Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    routes = [Route(CHAT, chat, methods=["POST"]), Route("/v1/models", models, methods=["GET"])]
    return Starlette(routes=routes, middleware=[cors])


class Observed:
    """Telemetry read back in memory: spans (direct or the SDK's), metrics, access lines."""

    def __init__(self, direct: bool, caplog: pytest.LogCaptureFixture, **options: Any) -> None:
        self.exporter = InMemorySpanExporter()
        processor = SimpleSpanProcessor(self.exporter)
        spans: dict[str, Any] = {"span_processor": processor}
        if not direct:
            provider = TracerProvider()
            provider.add_span_processor(processor)
            spans = {"tracer_provider": provider}
        reader = InMemoryMetricReader()
        self.telemetry = Telemetry(metric_readers=[reader], **spans, **options)
        self.caplog = caplog
        caplog.set_level(logging.INFO, logger=semconv.ACCESS_LOGGER)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def lines(self) -> list[dict[str, Any]]:
        records = self.caplog.records
        return [json.loads(r.getMessage()) for r in records if r.name == semconv.ACCESS_LOGGER]

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The Prometheus text's samples of `name`: (labels, value)."""
        found = []
        for line in self.telemetry.prometheus_text().decode().splitlines():
            head, _, value = line.rpartition(" ")
            if head == name or head.startswith(name + "{"):
                found.append((dict(re.findall(r'(\w+)="([^"]*)"', head)), float(value)))
        return found


async def call(port: int, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
    response = await clients.request(port, method, path, **kwargs)
    try:
        return response.status, b"" if method == "HEAD" else await response.body()
    finally:
        response.close()


JSON = [("Content-Type", "application/json")]
PREFLIGHT = [
    ("Origin", "http://app.example"),
    ("Access-Control-Request-Method", "POST"),
    ("Access-Control-Request-Headers", "content-type"),
]


async def traffic(port: int) -> list[int]:
    """A preflight, a HEAD, a model listing, a 404, a non-streaming chat, a streaming chat:
    their statuses."""
    statuses = []
    for method, path, body, headers in [
        ("OPTIONS", CHAT, b"", PREFLIGHT),
        ("HEAD", CHAT, b"", []),
        ("GET", "/v1/models", b"", []),
        ("GET", "/v1/nothing", b"", []),
        ("POST", CHAT, b'{"model": "m", "stream": false}', JSON),
        ("POST", CHAT, b'{"model": "m", "stream": true}', JSON),
    ]:
        status, _ = await call(port, method, path, body=body, headers=headers)
        statuses.append(status)
    await asyncio.sleep(0)  # each record is finished as its request's task ends
    return statuses


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sdk"])
async def test_only_streams_count_as_streams_and_only_genai_calls_as_genai(
    direct: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: after a CORS preflight, a HEAD, a model listing, a 404, a non-streaming chat and
    a streaming chat, `sidestream_streams_total` counts one stream and the GenAI duration two
    chat operations (time to first chunk: one); the spans of the four others are named by
    their method and carry no `gen_ai.*` attribute; only the two calls have access lines."""
    observed = Observed(direct, caplog)
    registry = StreamRegistry()
    guard = StreamGuard(server(), telemetry=observed.telemetry, registry=registry)
    async with serve(guard) as port:
        statuses = await traffic(port)
    assert statuses == [200, 405, 200, 404, 200, 200]
    assert observed.samples("sidestream_streams_total") == [
        ({"sidestream_outcome": "completed"}, 1)
    ]
    durations = observed.samples("gen_ai_client_operation_duration_seconds_count")
    assert [labels["gen_ai_operation_name"] for labels, _ in durations] == ["chat"]
    assert [count for _, count in durations] == [2]
    assert [
        n for _, n in observed.samples("gen_ai_client_operation_time_to_first_chunk_seconds_count")
    ] == [1]
    tokens = {
        labels["gen_ai_token_type"]: n
        for labels, n in observed.samples("gen_ai_client_token_usage_sum")
    }
    assert tokens == {"input": 10, "output": 4}  # both calls' usage: the stream's and the body's
    assert b"sidestream_active_streams 0\n" in prometheus_text(registry, observed.telemetry)
    spans = observed.spans()  # one per request
    assert sorted(span.name for span in spans) == [
        "GET",
        "GET",
        "HEAD",
        "OPTIONS",
        "chat m",
        "chat m",
    ]
    for span in spans:
        genai = {k for k in span.attributes or {} if k.startswith("gen_ai.")}
        assert bool(genai) == span.name.startswith("chat"), (span.name, genai)
    lines = observed.lines()
    assert [(line["path"], line["stream"]) for line in lines] == [(CHAT, False), (CHAT, True)]


async def test_access_all_gives_other_traffic_a_line_and_no_metric(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: with `Telemetry(access_all=True)` every request has an access line, the
    preflight's and the 404's too (no model, no tokens); the metrics are what they are
    without it."""
    observed = Observed(True, caplog, access_all=True)
    async with serve(StreamGuard(server(), telemetry=observed.telemetry)) as port:
        await traffic(port)
    lines = observed.lines()
    assert [(line["method"], line["status"]) for line in lines] == [
        ("OPTIONS", 200), ("HEAD", 405), ("GET", 200), ("GET", 404), ("POST", 200), ("POST", 200)
    ]  # fmt: skip
    for line in lines[:4]:
        assert line["model"] is None and line["tokens"] is None and line["stream"] is False
        assert line["chunks"] is None and line["keepalives"] is None
    assert observed.samples("sidestream_streams_total") == [
        ({"sidestream_outcome": "completed"}, 1)
    ]
    assert [n for _, n in observed.samples("gen_ai_client_operation_duration_seconds_count")] == [2]


async def test_a_stream_asked_for_and_refused_counts_as_a_stream_a_failed_call_as_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: a request whose body asked for a stream and got the server's 429 is a stream that
    never began (`rate_limited` in `sidestream_streams_total`); a non-streaming call answered
    500 is a GenAI call (its duration with `error.type` 500), not a stream; a 500 on a path
    that is not GenAI is neither."""
    observed = Observed(True, caplog)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/broken":
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"broken"})
            return
        await server()(scope, receive, send)

    async with serve(StreamGuard(app, telemetry=observed.telemetry)) as port:
        for body, status in [(b'{"model":"m","stream":true}', "429"), (b'{"model":"m"}', "500")]:
            got, _ = await call(
                port, "POST", CHAT, body=body, headers=[*JSON, ("x-status", status)]
            )
            assert got == int(status)
        assert (await call(port, "POST", "/broken"))[0] == 500
        await asyncio.sleep(0)
    assert observed.samples("sidestream_streams_total") == [
        ({"sidestream_outcome": "rate_limited"}, 1)
    ]
    durations = observed.samples("gen_ai_client_operation_duration_seconds_count")
    by_error = {labels.get("error_type", "none"): n for labels, n in durations}
    assert by_error == {"none": 1, "500": 1}  # the 429 (no error type) and the 500
    assert [line["status"] for line in observed.lines()] == [429, 500]


async def test_the_active_streams_gauge_counts_streams_not_other_requests_in_flight() -> None:
    """Rule: with a stream and a model listing both in flight (both heads sent, both bodies
    held), the registry holds two requests but `sidestream_active_streams` (Prometheus text,
    with and without telemetry, and the OTel gauge) says 1."""
    gate = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if scope["path"] == "/v1/models":
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await gate.wait()
            await send({"type": "http.response.body", "body": b'{"data":[]}'})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": ROLE, "more_body": True})
        await gate.wait()
        await send({"type": "http.response.body", "body": DONE})

    registry = StreamRegistry()
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    async with serve(StreamGuard(app, registry=registry, telemetry=telemetry)) as port:
        stream = await clients.request(port, "POST", CHAT, body=b"{}")
        listing = await clients.request(port, "GET", "/v1/models")
        try:
            await stream.chunk()
            assert len(registry) == 2
            assert b"sidestream_active_streams 1\n" in prometheus_text(registry, None)
            assert b"sidestream_active_streams 1\n" in prometheus_text(registry, telemetry)
            gauge = {m.name: m for m in telemetry.metrics()}[semconv.METRIC_ACTIVE_STREAMS]
            assert [p.value for p in gauge.data.data_points] == [1]  # type: ignore[union-attr]
            gate.set()
            assert await listing.body() == b'{"data":[]}'
            assert (await stream.body()).endswith(DONE)
        finally:
            stream.close()
            listing.close()


def test_from_env_reads_access_all_and_refuses_a_value_it_does_not_know() -> None:
    """Rule: `SIDESTREAM_TELEMETRY_ACCESS_ALL` turns the access line for other traffic on
    (`on`, `true`, `1`, ...), off when unset; a value that is neither is an error naming the
    variable, not a setting silently dropped."""
    for value, expected in [(None, False), ("on", True), ("TRUE", True), ("0", False)]:
        env = {} if value is None else {ACCESS_ALL: value}
        telemetry = Telemetry.from_env(environ=env)
        assert telemetry is not None and telemetry.access_all is expected, value
        telemetry.shutdown()
    with pytest.raises(ValueError, match=ACCESS_ALL):
        Telemetry.from_env(environ={ACCESS_ALL: "sometimes"})
