"""The GenAI names OTEL_SEMCONV_STABILITY_OPT_IN chooses, on the span and on the metrics.

Without the opt-in the provider is `gen_ai.system` and cache writes are
`gen_ai.usage.cache_creation.input_tokens`, as the Python GenAI instrumentations keep by
default; with `gen_ai_latest_experimental` they are the registry's `gen_ai.provider.name` and
`gen_ai.usage.cache_write.input_tokens`. The names are written out here, not taken from
`semconv`, so a test fails when the table does.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import Histogram, Metric
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry
from middleware.types import Message
from tests.support.apps import SCOPE, SSE_HEADERS

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
SYSTEM, PROVIDER = "gen_ai.system", "gen_ai.provider.name"
CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
CACHE_WRITE = "gen_ai.usage.cache_write.input_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
GENAI_METRICS = (
    "gen_ai.client.operation.duration",
    "gen_ai.client.operation.time_to_first_chunk",
    "gen_ai.client.operation.time_per_output_chunk",
    "gen_ai.client.token.usage",
)

# An Anthropic Messages stream whose usage reports cache reads and cache writes.
USAGE = (
    '{"input_tokens":40,"cache_read_input_tokens":30,"cache_creation_input_tokens":8,'
    '"output_tokens":1}'
)
STREAM = [
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","model":"claude-x","content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":' + USAGE.encode() + b"}}\n\n",
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    b"\n\n",
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}'
    b"\n\n",
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}'
    b"\n\n",
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":2}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


async def relay(telemetry: Telemetry) -> None:
    """One Anthropic stream through StreamGuard with `telemetry`, to its end."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for event in STREAM:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> Message:
        body = b'{"model": "claude-x", "stream": true, "max_tokens": 64}'
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope = {**SCOPE, "path": "/v1/messages", "raw_path": b"/v1/messages"}
    await StreamGuard(app, telemetry=telemetry, keepalive_interval=None)(scope, receive, send)


def with_spans(**options: Any) -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return Telemetry(span_processor=SimpleSpanProcessor(exporter), **options), exporter


def span_attributes(exporter: InMemorySpanExporter) -> dict[str, Any]:
    (span,) = exporter.get_finished_spans()
    return dict(span.attributes or {})


def genai_metric_attributes(telemetry: Telemetry) -> dict[str, list[dict[str, Any]]]:
    """Each GenAI metric's data points' attributes."""
    metrics: dict[str, Metric] = {m.name: m for m in telemetry.metrics()}
    found = {}
    for name in GENAI_METRICS:
        data = metrics[name].data
        assert isinstance(data, Histogram)
        found[name] = [dict(point.attributes or {}) for point in data.data_points]
    return found


async def test_without_the_opt_in_the_span_and_metrics_use_the_default_names() -> None:
    """No opt-in: the provider is `gen_ai.system` on the span and on every GenAI metric's
    points, cache writes are `gen_ai.usage.cache_creation.input_tokens`; the latest
    spellings appear nowhere, and the names both modes share are there."""
    telemetry, exporter = with_spans(semconv_opt_in="")
    await relay(telemetry)
    telemetry.shutdown()
    attributes = span_attributes(exporter)
    assert attributes[SYSTEM] == "anthropic"
    assert attributes[CACHE_CREATION] == 8
    assert attributes[CACHE_READ] == 30
    assert PROVIDER not in attributes and CACHE_WRITE not in attributes
    assert attributes["gen_ai.usage.input_tokens"] == 40
    assert attributes["gen_ai.request.model"] == "claude-x"
    for name, points in genai_metric_attributes(telemetry).items():
        assert points, name
        for point in points:
            assert point[SYSTEM] == "anthropic" and PROVIDER not in point, name


async def test_gen_ai_latest_experimental_among_other_values_selects_the_latest_names() -> None:
    """`gen_ai_latest_experimental` in a comma-separated list with other categories' values
    and spaces: the provider is `gen_ai.provider.name` on the span and on every GenAI metric's
    points, cache writes are `gen_ai.usage.cache_write.input_tokens`; the default spellings
    appear nowhere."""
    telemetry, exporter = with_spans(semconv_opt_in="http/dup, gen_ai_latest_experimental ,x")
    await relay(telemetry)
    telemetry.shutdown()
    attributes = span_attributes(exporter)
    assert attributes[PROVIDER] == "anthropic"
    assert attributes[CACHE_WRITE] == 8
    assert attributes[CACHE_READ] == 30
    assert SYSTEM not in attributes and CACHE_CREATION not in attributes
    for name, points in genai_metric_attributes(telemetry).items():
        assert points, name
        for point in points:
            assert point[PROVIDER] == "anthropic" and SYSTEM not in point, name


async def test_the_environment_is_read_once_when_telemetry_is_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Telemetry()` reads OTEL_SEMCONV_STABILITY_OPT_IN from the environment when it is
    made; changing the variable afterwards changes nothing for the streams it reports."""
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    latest, latest_spans = with_spans()
    monkeypatch.delenv(OPT_IN)
    default, default_spans = with_spans()
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    await relay(latest)
    await relay(default)
    latest.shutdown()
    default.shutdown()
    assert PROVIDER in span_attributes(latest_spans)
    assert SYSTEM in span_attributes(default_spans)


@pytest.mark.parametrize(
    ("environ", "provider"),
    [({}, SYSTEM), ({OPT_IN: "gen_ai_latest_experimental"}, PROVIDER)],
)
async def test_from_env_reads_the_opt_in_from_the_environment_it_is_given(
    environ: dict[str, str], provider: str
) -> None:
    """`Telemetry.from_env(environ=...)` takes the opt-in from that mapping: the metrics of
    a stream (no exporter configured, so no spans) carry the provider under its name."""
    telemetry = Telemetry.from_env(environ=environ)
    assert telemetry is not None
    await relay(telemetry)
    telemetry.shutdown()
    for points in genai_metric_attributes(telemetry).values():
        assert all(point[provider] == "anthropic" for point in points)
