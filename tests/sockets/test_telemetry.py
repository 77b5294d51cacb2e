"""Telemetry spans through StreamGuard on real sockets: one span per stream, its attributes,
events and status for completed, cancelled, timed-out and failed streams, and fidelity.

The sidecar case (span kind CLIENT) runs the built-in emulator behind `ProxyApp`; the
middleware case (SERVER) wraps small scripted apps from tests/support/apps.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry, semconv
from middleware.telemetry.sinks import SINKS
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.upstream.types import Upstream
from tests.support import clients
from tests.support.apps import DONE, ROLE, chunk, scripted
from tests.support.servers import serve
from tests.support.sseparse import parse

MODEL = "llama-3-8b"
SECRET = "Bearer sk-do-not-log-me"
PROMPT = "the prompt nobody may see"


class Spans:
    """Telemetry wired to in-memory span and metric collectors: direct spans (the sidecar's)
    or the SDK's, as the `span_mode` fixture says — every test here runs with both."""

    direct = True

    def __init__(self, kind: SpanKind = SpanKind.SERVER, **options: Any) -> None:
        self.exporter = InMemorySpanExporter()
        processor = SimpleSpanProcessor(self.exporter)
        if self.direct:
            spans: dict[str, Any] = {"span_processor": processor}
        else:
            provider = TracerProvider()
            provider.add_span_processor(processor)
            spans = {"tracer_provider": provider}
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(metric_readers=[self.reader], span_kind=kind, **spans, **options)

    async def one(self, timeout: float = 5.0) -> ReadableSpan:
        """The single finished span (the server ends it after the client is done)."""
        deadline = time.monotonic() + timeout
        while not self.exporter.get_finished_spans():
            assert time.monotonic() < deadline, "no span was ended"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a second span would show up by now
        spans = self.exporter.get_finished_spans()
        assert len(spans) == 1, [s.name for s in spans]
        return spans[0]


def chat_body(tokens: int = 20, ttft_ms: int = 50, itl_ms: int = 5, **extra: Any) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": 1000,
        "temperature": 0.5,
        "top_p": 0.9,
        "stream_options": {"include_usage": True},
        "sidestream": {"tokens": tokens, "ttft_ms": ttft_ms, "itl_ms": itl_ms},
        **extra,
    }
    if not body["stream"]:
        del body["stream_options"]
    return json.dumps(body).encode()


HEADERS = [
    ("Content-Type", "application/json"),
    ("Authorization", SECRET),
    ("Cookie", "session=also-secret"),
    ("User-Agent", "telemetry-test/1.0"),
]


@pytest.fixture(autouse=True, params=["direct", "sdk"])
def span_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Direct spans and SDK spans must show the same."""
    monkeypatch.setattr(Spans, "direct", request.param == "direct")
    return str(request.param)


@contextlib.asynccontextmanager
async def sidecar(spans_options: dict[str, Any], **guard: Any) -> AsyncIterator[tuple[int, Spans]]:
    """Emulator <- ProxyApp <- StreamGuard(telemetry CLIENT), both on 127.0.0.1."""
    async with serve(make_app(stats=Stats())) as upstream_port:
        spans = Spans(
            SpanKind.CLIENT,
            server_address="127.0.0.1",
            server_port=upstream_port,
            **spans_options,
        )
        proxy = ProxyApp(Upstream.parse(f"http://127.0.0.1:{upstream_port}"))
        app = StreamGuard(proxy, telemetry=spans.telemetry, **guard)
        try:
            async with serve(app, "sidecar", proxy_headers=False) as port:
                yield port, spans
        finally:
            await proxy.aclose()


async def post(port: int, body: bytes) -> clients.RawResponse:
    return await clients.request(port, "POST", "/v1/chat/completions", body=body, headers=HEADERS)


def usage_of(raw: bytes) -> dict[str, int]:
    for _, data, _ in parse(raw):
        if data.startswith("{") and '"usage"' in data:
            usage = json.loads(data).get("usage")
            if usage:
                return dict(usage)
    raise AssertionError("the stream carried no usage")


def no_secrets(span: ReadableSpan) -> None:
    text = json.dumps(dict(span.attributes or {})) + json.dumps(
        [dict(e.attributes or {}) for e in span.events]
    )
    for secret in (SECRET, "sk-do-not-log-me", "also-secret", PROMPT):
        assert secret not in text


async def test_completed_stream_has_one_span_with_genai_http_and_sidestream_attributes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A completed sidecar stream: one CLIENT span named `chat <model>`, GenAI request and
    response attributes, usage equal to the upstream's, HTTP attributes, sidestream's own
    counters, the first-chunk and upstream-done events, no error, no secrets."""
    caplog.set_level(logging.INFO, logger=semconv.ACCESS_LOGGER)
    async with sidecar({}) as (port, spans):
        response = await post(port, chat_body(tokens=20))
        raw = await response.body()
        response.close()
        span = await spans.one()
    assert response.status == 200
    usage = usage_of(raw)
    a = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert a[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert a[semconv.GENAI_DEFAULT.provider] == "openai"
    assert a[semconv.GEN_AI_REQUEST_MODEL] == MODEL
    assert a[semconv.GEN_AI_REQUEST_STREAM] is True
    assert a[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 1000
    assert a[semconv.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert a[semconv.GEN_AI_REQUEST_TOP_P] == 0.9
    assert str(a[semconv.GEN_AI_RESPONSE_ID]).startswith("chatcmpl")
    assert a[semconv.GEN_AI_RESPONSE_MODEL] == MODEL
    assert list(a[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ["stop"]  # type: ignore[arg-type]
    assert a[semconv.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"] == 20
    assert a[semconv.TOKENS] == 20
    assert a[semconv.SERVER_ADDRESS] == "127.0.0.1"
    assert isinstance(a[semconv.SERVER_PORT], int)
    assert a[semconv.HTTP_REQUEST_METHOD] == "POST"
    assert a[semconv.URL_PATH] == "/v1/chat/completions"
    assert a[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[semconv.CLIENT_ADDRESS] == "127.0.0.1"
    assert a[semconv.USER_AGENT_ORIGINAL] == "telemetry-test/1.0"
    assert a[semconv.OUTCOME] == "completed"
    assert a[semconv.BYTES] == len(raw)
    # Chunks are the upstream's reads, each relayed as it came: more than one (the first token
    # comes 50 ms before the rest), no more than the events written (a loaded machine may
    # read two writes at once, so not one per token).
    assert 2 <= a[semconv.CHUNKS] <= raw.count(b"\n\n")  # type: ignore[operator]
    assert a[semconv.KEEPALIVES] == 0
    assert 0.04 < a[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] < 1.0  # type: ignore[operator]
    assert 0 < a[semconv.GAP_P50] <= a[semconv.GAP_P99] <= a[semconv.GAP_MAX]  # type: ignore[operator]
    assert a[semconv.TOKENS_PER_SECOND] > 0  # type: ignore[operator]
    assert semconv.CANCEL_LATENCY not in a
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in a
    assert [e.name for e in span.events] == [semconv.EVENT_FIRST_CHUNK, semconv.EVENT_UPSTREAM_DONE]
    assert span.start_time is not None and span.end_time is not None
    first = span.events[0].timestamp
    ttft_ns = a[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] * 1e9  # type: ignore[operator]
    assert abs(first - span.start_time - ttft_ns) < 1e6
    no_secrets(span)
    lines = [r.getMessage() for r in caplog.records if r.name == semconv.ACCESS_LOGGER]
    assert len(lines) == 1
    log = json.loads(lines[0])
    assert log["trace_id"] == format(span.context.trace_id, "032x")
    assert log["outcome"] == "completed" and log["status"] == 200 and log["tokens"] == 20
    assert log["output_tokens"] == 20 and log["bytes"] == len(raw)
    for key in ("request_id", "ttft_ms", "itl_p50_ms", "itl_p99_ms", "tokens_per_s", "duration_ms"):
        assert log[key] is not None, key
    assert "cancel_latency_ms" in log
    for secret in ("sk-do-not-log-me", "also-secret", PROMPT):
        assert secret not in lines[0]


async def test_client_that_leaves_is_not_an_error_and_keeps_partial_counts() -> None:
    """A client that disconnects mid-stream: outcome client_disconnected, status not ERROR,
    a client-disconnect event, finish reason ["error"], the tokens relayed so far, and the
    cancel latency."""
    async with sidecar({}) as (port, spans):
        response = await post(port, chat_body(tokens=200, ttft_ms=10, itl_ms=10))
        seen = b""
        while seen.count(b'"content":"') < 6:
            seen += await response.chunk() or b""
        response.close()
        span = await spans.one()
    a = dict(span.attributes or {})
    assert a[semconv.OUTCOME] == "client_disconnected"
    assert span.status.status_code is StatusCode.UNSET
    assert semconv.EVENT_CLIENT_DISCONNECT in [e.name for e in span.events]
    assert list(a[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ["error"]  # type: ignore[arg-type]
    assert 5 <= a[semconv.TOKENS] < 200  # type: ignore[operator]
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == a[semconv.TOKENS]
    assert 0 <= a[semconv.CANCEL_LATENCY] < 0.5  # type: ignore[operator]


async def test_first_token_timeout_is_an_error_with_an_exception_event() -> None:
    """A first-token timeout after headers: outcome first_token_timeout, ERROR status,
    error.type, an exception event, finish reason ["error"], no first-chunk event."""
    async with sidecar({}, first_token_timeout=0.3) as (port, spans):
        response = await post(port, chat_body(tokens=5, ttft_ms=3000))
        await response.body()
        response.close()
        span = await spans.one()
    a = dict(span.attributes or {})
    assert a[semconv.OUTCOME] == "first_token_timeout"
    assert a[semconv.ERROR_TYPE] == "first_token_timeout"
    assert span.status.status_code is StatusCode.ERROR
    names = [e.name for e in span.events]
    assert "exception" in names and semconv.EVENT_FIRST_CHUNK not in names
    assert list(a[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ["error"]  # type: ignore[arg-type]
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 0
    assert semconv.CANCEL_LATENCY in a


async def test_idle_timeout_in_middleware_mode_is_a_server_span_with_error() -> None:
    """Middleware mode: a SERVER span; a stall past idle_timeout ends it as idle_timeout with
    ERROR status and the tokens that did arrive."""
    spans = Spans()
    app = scripted([(0, ROLE), (0, chunk("a")), (0, chunk("b")), (2.0, chunk("late")), (0, DONE)])
    guard = StreamGuard(app, idle_timeout=0.2, telemetry=spans.telemetry)
    async with serve(guard) as port:
        response = await clients.request(port, "POST", "/v1/chat/completions", body=b"{}")
        await response.body()
        response.close()
        span = await spans.one()
    a = dict(span.attributes or {})
    assert span.kind is SpanKind.SERVER
    assert span.name == "chat"  # no model in the request
    assert a[semconv.OUTCOME] == "idle_timeout"
    assert span.status.status_code is StatusCode.ERROR
    assert a[semconv.TOKENS] == 2
    assert a[semconv.SERVER_PORT] == port


async def test_a_read_ending_where_a_token_starts_is_relayed_and_counted() -> None:
    """A token chunk cut by the upstream's reads right after its content's opening quote
    (the learned frame's whole prefix, and nothing more) is relayed byte for byte and
    counted once: the frame check must not index past the chunk (it raised IndexError)."""
    spans = Spans()
    cut = chunk("b")
    at = cut.index(b'"content":"') + len(b'"content":"')
    app = scripted([(0, ROLE), (0, chunk("a")), (0, cut[:at]), (0, cut[at:]), (0, DONE)])
    async with serve(StreamGuard(app, telemetry=spans.telemetry)) as port:
        response = await clients.request(port, "POST", "/v1/chat/completions", body=b"{}")
        body = await response.body()
        response.close()
        span = await spans.one()
    assert body == ROLE + chunk("a") + cut + DONE
    a = dict(span.attributes or {})
    assert a[semconv.OUTCOME] == "completed"
    assert a[semconv.TOKENS] == 2


async def test_app_failure_mid_stream_is_upstream_error() -> None:
    """An app that raises mid-stream: outcome upstream_error, ERROR, an exception event."""
    spans = Spans()
    app = scripted([(0, ROLE), (0, chunk("a"))], fail_after=True)
    async with serve(StreamGuard(app, telemetry=spans.telemetry)) as port:
        response = await clients.request(port, "POST", "/v1/chat/completions", body=b"{}")
        await response.body()
        response.close()
        span = await spans.one()
    assert dict(span.attributes or {})[semconv.OUTCOME] == "upstream_error"
    assert span.status.status_code is StatusCode.ERROR
    assert "exception" in [e.name for e in span.events]


async def test_span_ttft_matches_the_client_and_tokens_match_usage() -> None:
    """Fidelity: the span's time to first chunk is within 2 ms of what a client on the same
    machine measures, and its token counts equal the upstream's usage."""
    async with sidecar({}) as (port, spans):
        async with clients.connection(port) as (reader, writer):
            body = chat_body(tokens=30, ttft_ms=200, itl_ms=2)
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            sent = time.monotonic()
            writer.write(head + body)
            response = await clients.read_response(reader, writer)
            first: float | None = None
            raw = b""
            while (data := await response.chunk()) is not None:
                raw += data
                if first is None and re.search(rb'"content":"[^"]', raw):
                    first = time.monotonic()
            response.close()
        span = await spans.one()
    assert first is not None
    client_ttft = first - sent
    a = dict(span.attributes or {})
    span_ttft = a[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert abs(span_ttft - client_ttft) < 0.002, (span_ttft, client_ttft)  # type: ignore[operator]
    usage = usage_of(raw)
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"] == a[semconv.TOKENS]
    assert a[semconv.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]


async def test_capture_content_records_the_aggregated_completion_capped() -> None:
    """capture_content=True adds gen_ai.output.messages: one assistant message holding the
    joined completion text, cut at capture_limit characters."""
    async with sidecar({"capture_content": True, "capture_limit": 25}) as (port, spans):
        response = await post(port, chat_body(tokens=40, ttft_ms=0, itl_ms=0))
        raw = await response.body()
        response.close()
        span = await spans.one()
    text = "".join(
        json.loads(d)["choices"][0]["delta"].get("content", "")
        for _, d, _ in parse(raw)
        if d.startswith("{") and json.loads(d)["choices"]
    )
    messages = json.loads(str(dict(span.attributes or {})[semconv.GEN_AI_OUTPUT_MESSAGES]))
    assert messages == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": text[:25]}],
            "finish_reason": "stop",
        }
    ]


async def test_non_streaming_request_gets_one_cheap_span() -> None:
    """A non-streaming completion gets one span with its request attributes and status, and
    no stream attributes."""
    async with sidecar({}) as (port, spans):
        response = await post(port, chat_body(tokens=3, ttft_ms=0, itl_ms=0, stream=False))
        await response.body()
        response.close()
        span = await spans.one()
    a = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert a[semconv.GEN_AI_REQUEST_STREAM] is False
    assert a[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[semconv.OUTCOME] == "completed"
    assert semconv.CHUNKS not in a and semconv.EVENT_FIRST_CHUNK not in [
        e.name for e in span.events
    ]


@pytest.mark.parametrize("off", ["span", "metrics", "access"])
async def test_each_sink_can_be_left_out_while_the_others_still_report(
    off: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: turning one output off is configuration (`Telemetry(sinks=...)`), not a source
    patch: that output is missing (without the span sink no span is even started), and the
    other two report the stream whole."""
    spans = Spans(sinks=SINKS - {off})
    stream = [(0, ROLE), (0, chunk("a")), (0.01, chunk("b")), (0, DONE)]
    with caplog.at_level(logging.INFO, logger=semconv.ACCESS_LOGGER):
        async with serve(StreamGuard(scripted(stream), telemetry=spans.telemetry)) as port:
            response = await clients.request(
                port, "POST", "/v1/chat/completions", body=b'{"model": "m1", "stream": true}'
            )
            await response.body()
            response.close()
            await asyncio.sleep(0.05)
    finished = spans.exporter.get_finished_spans()
    metrics = {m.name: m for m in spans.telemetry.metrics()}
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == semconv.ACCESS_LOGGER]
    if off == "span":
        assert finished == ()
    else:
        (span,) = finished
        a = dict(span.attributes or {})
        assert a[semconv.OUTCOME] == "completed" and a[semconv.TOKENS] == 2
    if off == "metrics":
        assert semconv.METRIC_STREAMS not in metrics
        assert semconv.METRIC_OPERATION_DURATION not in metrics
    else:
        (streams,) = metrics[semconv.METRIC_STREAMS].data.data_points
        assert streams.value == 1 and streams.attributes == {semconv.OUTCOME: "completed"}
        (usage,) = metrics[semconv.METRIC_TOKEN_USAGE].data.data_points
        assert usage.sum == 2
    if off == "access":
        assert lines == []
    else:
        (line,) = lines
        assert line["outcome"] == "completed" and line["tokens"] == 2
        trace_id = None if off == "span" else f"{finished[0].context.trace_id:032x}"
        assert line["trace_id"] == trace_id
