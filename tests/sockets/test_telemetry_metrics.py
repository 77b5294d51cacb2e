"""Telemetry metrics, Prometheus text and configuration: GenAI histograms with the
conventions' buckets, sidestream's counters and gauge, the chunk histogram, `from_env`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import uvloop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.trace import SpanKind

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, prometheus_text, semconv
from middleware.telemetry.instruments import LocalCounter, LocalHistogram, series
from middleware.telemetry.prometheus import metric_name
from middleware.telemetry.sinks import SINKS
from tests.support import clients
from tests.support.apps import DONE, ROLE, SCOPE, SSE_HEADERS, Probe, chunk, scripted
from tests.support.servers import serve


def collected(telemetry: Telemetry) -> dict[str, Metric]:
    """Every metric as a collection or an export sees it, the locally aggregated included."""
    return {m.name: m for m in telemetry.metrics()}


def points(metric: Metric) -> list[Any]:
    assert isinstance(metric.data, (Histogram, Sum))
    return list(metric.data.data_points)


async def run_streams(telemetry: Telemetry, scripts: list[Any], **guard: Any) -> StreamGuard:
    app_scripts = iter(scripts)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await scripted(next(app_scripts))(scope, receive, send)  # type: ignore[operator]

    guard_app = StreamGuard(app, telemetry=telemetry, **guard)
    async with serve(guard_app) as port:
        for _ in scripts:
            response = await clients.request(
                port, "POST", "/v1/chat/completions", body=b'{"model": "m1", "stream": true}'
            )
            try:
                await response.body()
            finally:
                response.close()
        await asyncio.sleep(0.05)
    return guard_app


STREAM = [(0, ROLE), (0, chunk("a")), (0.03, chunk("b")), (0.03, chunk("c")), (0, DONE)]


async def test_genai_metrics_use_the_conventions_buckets_and_attributes() -> None:
    """Duration, time to first chunk and token usage are histograms with the GenAI bucket
    boundaries and the required attributes; outcomes are counted."""
    telemetry = Telemetry()
    await run_streams(telemetry, [STREAM, STREAM])
    metrics = collected(telemetry)
    for name in (semconv.METRIC_OPERATION_DURATION, semconv.METRIC_TIME_TO_FIRST_CHUNK):
        (point,) = points(metrics[name])
        assert isinstance(point, HistogramDataPoint)
        assert tuple(point.explicit_bounds) == semconv.DURATION_BUCKETS
        assert point.count == 2
        assert point.attributes == {
            semconv.GEN_AI_OPERATION_NAME: "chat",
            semconv.GENAI_DEFAULT.provider: "openai",
            semconv.GEN_AI_REQUEST_MODEL: "m1",
            semconv.SERVER_ADDRESS: "127.0.0.1",
            semconv.SERVER_PORT: point.attributes[semconv.SERVER_PORT],
        }
    (usage,) = points(metrics[semconv.METRIC_TOKEN_USAGE])
    assert tuple(usage.explicit_bounds) == semconv.TOKEN_BUCKETS
    assert usage.attributes[semconv.GEN_AI_TOKEN_TYPE] == "output" and usage.sum == 6
    (streams,) = points(metrics[semconv.METRIC_STREAMS])
    assert isinstance(streams, NumberDataPoint)
    assert streams.value == 2 and streams.attributes == {semconv.OUTCOME: "completed"}


async def test_time_per_output_chunk_counts_every_gap_in_the_conventions_buckets() -> None:
    """The chunk histogram holds one count per gap after the first content chunk (2 per
    stream here), in the right 10 ms-doubling bucket, in Prometheus text and in metrics()."""
    telemetry = Telemetry()
    await run_streams(telemetry, [STREAM, STREAM])
    tpoc = {m.name: m for m in telemetry.metrics()}[semconv.METRIC_TIME_PER_OUTPUT_CHUNK]
    (point,) = points(tpoc)
    assert point.count == 4
    assert tuple(point.explicit_bounds) == semconv.DURATION_BUCKETS
    # 30 ms gaps: bucket (0.02, 0.04] is index 2; a loaded machine may push one higher
    assert sum(point.bucket_counts[2:4]) == 4
    assert 0.1 < point.sum < 0.5
    text = telemetry.prometheus_text().decode()
    name = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert f"# TYPE {name} histogram" in text
    assert any(
        line.startswith(f"{name}_count{{") and line.endswith(" 4") for line in text.splitlines()
    )


async def test_prometheus_text_has_every_instrument() -> None:
    """Prometheus text: GenAI histograms with unit suffix and le buckets up to +Inf,
    sidestream counters with _total, and the active-streams gauge."""
    telemetry = Telemetry()
    guard = await run_streams(telemetry, [STREAM])
    text = prometheus_text(guard.registry, telemetry).decode()
    lines = text.splitlines()
    assert "sidestream_active_streams 0" in lines
    assert lines.count("# TYPE sidestream_active_streams gauge") == 1
    assert "# TYPE gen_ai_client_operation_duration_seconds histogram" in lines
    assert "# TYPE gen_ai_client_operation_time_to_first_chunk_seconds histogram" in lines
    assert "# TYPE gen_ai_client_token_usage histogram" in lines
    assert any(
        'le="+Inf"' in line and line.startswith("gen_ai_client_operation_duration_seconds_bucket")
        for line in lines
    )
    assert 'sidestream_streams_total{sidestream_outcome="completed"} 1' in lines


async def test_keepalives_and_cancellations_are_counted() -> None:
    """A stream that stalls gets keep-alives (counted); one cut by the idle timeout is
    counted as a cancellation by outcome, and its cancel latency is in the histogram by
    outcome; a completed stream adds no cancel latency."""
    telemetry = Telemetry()
    stalled = [(0, ROLE), (0, chunk("a")), (0.35, chunk("b")), (0, DONE)]
    await run_streams(telemetry, [stalled, STREAM], keepalive_interval=0.1, idle_timeout=0.25)
    text = telemetry.prometheus_text().decode().splitlines()
    keepalives = [line for line in text if line.startswith("sidestream_keepalives_total")]
    assert keepalives and int(keepalives[0].split()[-1]) >= 1
    assert 'sidestream_cancellations_total{sidestream_outcome="idle_timeout"} 1' in text
    assert 'sidestream_streams_total{sidestream_outcome="idle_timeout"} 1' in text
    assert 'sidestream_cancel_latency_seconds_count{sidestream_outcome="idle_timeout"} 1' in text
    assert not [line for line in text if "cancel_latency" in line and '"completed"' in line]


async def test_active_streams_gauge_counts_in_flight_streams_with_or_without_telemetry() -> None:
    """prometheus_text(registry, None) serves sidestream_active_streams with telemetry off;
    with telemetry the gauge is also an OTel instrument. Both count an open stream."""
    registry = StreamRegistry()
    telemetry = Telemetry()
    probe = Probe()
    app = scripted([(0, ROLE), (5.0, DONE)], probe)
    async with serve(StreamGuard(app, registry=registry, telemetry=telemetry)) as port:
        response = await clients.request(port, "POST", "/v1/chat/completions", body=b"{}")
        await response.chunk()
        assert b"sidestream_active_streams 1\n" in prometheus_text(registry, None)
        assert b"sidestream_active_streams 1\n" in prometheus_text(registry, telemetry)
        gauge = {m.name: m for m in telemetry.metrics()}[semconv.METRIC_ACTIVE_STREAMS]
        assert [p.value for p in gauge.data.data_points] == [1]  # type: ignore[union-attr]
        response.close()
        await probe.wait()
    assert b"sidestream_active_streams 0\n" in prometheus_text(registry, None)
    assert prometheus_text(None, None) == (
        b"# HELP sidestream_active_streams Streams in flight through the guard.\n"
        b"# TYPE sidestream_active_streams gauge\nsidestream_active_streams 0\n"
    )


async def test_non_genai_requests_make_no_metrics_or_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plain request on a non-GenAI path (a health check) is not a stream: no duration,
    no outcome counted, no access-log line."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    telemetry = Telemetry()

    async def health(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async with serve(StreamGuard(health, telemetry=telemetry)) as port:
        response = await clients.request(port, "GET", "/health")
        assert await response.body() == b"ok"
        response.close()
    names = set(collected(telemetry))
    assert semconv.METRIC_OPERATION_DURATION not in names
    assert semconv.METRIC_STREAMS not in names
    assert not [r for r in caplog.records if r.name == semconv.ACCESS_LOGGER]


def test_from_env_follows_the_otel_variables() -> None:
    """OTEL_SDK_DISABLED=true turns telemetry off; spans (direct ones) are made only when an
    OTLP endpoint (or OTEL_TRACES_EXPORTER=otlp) is configured; OTEL_SERVICE_NAME names the
    service."""
    assert Telemetry.from_env(environ={"OTEL_SDK_DISABLED": "true"}) is None
    quiet = Telemetry.from_env(environ={})
    assert quiet is not None and quiet.span_kind is SpanKind.SERVER
    assert quiet.tracer is None and quiet.direct is None
    quiet.shutdown()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_METRICS_EXPORTER": "none"}
    on = Telemetry.from_env(SpanKind.CLIENT, environ=env, server_address="vllm")
    assert on is not None and on.direct is not None and on.span_kind is SpanKind.CLIENT
    assert on.tracer is None and on.direct.kind is SpanKind.CLIENT
    assert on.server_address == "vllm"
    on.tracer_provider.shutdown()  # type: ignore[union-attr]  # nothing was recorded
    on.meter_provider.shutdown()
    off = Telemetry.from_env(environ={**env, "OTEL_TRACES_EXPORTER": "none"})
    assert off is not None and off.tracer is None and off.direct is None
    off.shutdown()


def test_from_env_chooses_the_sinks_from_sidestream_telemetry_sinks() -> None:
    """SIDESTREAM_TELEMETRY_SINKS: comma-separated sink names (spaces and case forgiven),
    `none` for none, unset or empty for all; an unknown name is an error at start, not a
    sink silently missing. Without the span sink no exporter or span is made."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_METRICS_EXPORTER": "none"}
    for value, names in [
        (None, SINKS),
        ("", SINKS),
        ("metrics, ACCESS", {"metrics", "access"}),
        ("span", {"span"}),
        ("none", set()),
    ]:
        environ = dict(env) if value is None else {**env, "SIDESTREAM_TELEMETRY_SINKS": value}
        telemetry = Telemetry.from_env(environ=environ)
        assert telemetry is not None
        assert telemetry.sink_names == names, value
        assert len(telemetry.sinks) == len(names)
        assert (telemetry.direct is not None) == ("span" in names), value
        telemetry.shutdown()
    with pytest.raises(ValueError, match=r"SIDESTREAM_TELEMETRY_SINKS.*spans"):
        Telemetry.from_env(environ={"SIDESTREAM_TELEMETRY_SINKS": "spans,metrics"})
    with pytest.raises(ValueError, match="unknown telemetry sink log"):
        Telemetry(sinks={"metrics", "log"})


def test_prometheus_names_follow_the_otel_rules() -> None:
    """Dots become underscores, `s` becomes _seconds, {annotations} add nothing, counters
    end in _total."""
    assert metric_name("gen_ai.client.operation.duration", "s") == (
        "gen_ai_client_operation_duration_seconds"
    )
    assert metric_name("gen_ai.client.token.usage", "{token}") == "gen_ai_client_token_usage"
    assert metric_name("sidestream.streams", "{stream}", counter=True) == "sidestream_streams_total"


async def test_access_log_line_is_one_json_object(caplog: pytest.LogCaptureFixture) -> None:
    """One access-log line per stream: a single JSON object with the documented fields."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    await run_streams(Telemetry(), [STREAM])
    (record,) = [r for r in caplog.records if r.name == semconv.ACCESS_LOGGER]
    line = json.loads(record.getMessage())
    assert set(line) >= {
        "request_id", "trace_id", "outcome", "status", "ttft_ms", "itl_p50_ms", "itl_p99_ms",
        "tokens", "tokens_per_s", "duration_ms", "bytes", "cancel_latency_ms",
    }  # fmt: skip
    assert line["trace_id"] is None  # no tracer configured
    assert line["tokens"] == 3 and line["outcome"] == "completed"
    assert 20 <= line["itl_p50_ms"] <= 60


async def test_access_log_line_holds_any_text_as_json_would(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The access line is written from a template, not by json.dumps: a request id and a
    model holding quotes, backslashes, control characters and non-ASCII text still make
    one line of valid JSON whose values are exactly those strings, numbers are numbers, and
    what is unknown (no span: no trace id) is null."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    hostile = 'a"b\\c\n\x00\u2028é😀'
    body = json.dumps({"model": hostile, "stream": True}).encode()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for piece in (ROLE, chunk("a"), chunk("b"), DONE):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> Any:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        pass

    request_id = 'q"\\\x01\x7f\xe9'  # what a header can hold (latin-1)
    scope = {**SCOPE, "headers": [(b"x-request-id", request_id.encode("latin-1"))]}
    await StreamGuard(app, telemetry=Telemetry())(scope, receive, send)
    (record,) = [r for r in caplog.records if r.name == semconv.ACCESS_LOGGER]
    text = record.getMessage()
    assert "\n" not in text and text.isascii()
    line = json.loads(text)
    assert list(line) == [
        "time", "level", "logger", "request_id", "trace_id", "span_id", "method", "path",
        "model", "outcome", "status", "stream", "ttft_ms", "itl_p50_ms", "itl_p99_ms",
        "itl_max_ms", "tokens", "input_tokens", "output_tokens", "usage_source",
        "tokens_per_s", "duration_ms", "bytes", "chunks", "keepalives", "cancel_latency_ms",
    ]  # fmt: skip
    assert line["request_id"] == request_id and line["model"] == hostile
    assert line["path"] == "/v1/chat/completions" and line["method"] == "POST"
    assert line["level"] == "info" and line["logger"] == semconv.ACCESS_LOGGER
    assert line["trace_id"] is None and line["span_id"] is None and line["status"] == 200
    assert line["stream"] is True and line["tokens"] == 2 and line["input_tokens"] is None
    assert isinstance(line["duration_ms"], float) and isinstance(line["bytes"], int)
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-12-02T01:22:16.123Z")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"x-request-id", b"r1"), (b"x-request-id", b"r2")], "r1"),
        ([(b"x-request-id", b"x" * 500)], "x" * 128),
        ([(b"x-request-id", b"")], None),
        ([], None),
    ],
    ids=["first", "capped", "empty", "absent"],
)
async def test_the_log_lines_request_id_is_the_clients_else_one_made(
    headers: list[tuple[bytes, bytes]], expected: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """The request id is the client's first `x-request-id` (its first 128 characters); with
    none, or an empty one, the line gets 32 random hex digits of its own."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        pass

    await StreamGuard(app, telemetry=Telemetry())({**SCOPE, "headers": headers}, receive, send)
    (record,) = [r for r in caplog.records if r.name == semconv.ACCESS_LOGGER]
    request_id = json.loads(record.getMessage())["request_id"]
    if expected is None:
        assert len(request_id) == 32 and int(request_id, 16) >= 0
    else:
        assert request_id == expected


class Collecting(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


async def test_exported_metrics_include_the_chunk_histogram() -> None:
    """A metric exporter (OTLP in production) receives the time-per-output-chunk histogram
    next to the SDK's instruments, in sidestream's instrumentation scope."""
    exporter = Collecting()
    telemetry = Telemetry(metric_exporters=[exporter])
    await run_streams(telemetry, [STREAM])
    await asyncio.to_thread(telemetry.meter_provider.force_flush)
    await asyncio.to_thread(telemetry.meter_provider.shutdown)
    names = {
        (sm.scope.name, m.name)
        for data in exporter.exported
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert (semconv.INSTRUMENTATION_SCOPE, semconv.METRIC_TIME_PER_OUTPUT_CHUNK) in names
    assert (semconv.INSTRUMENTATION_SCOPE, semconv.METRIC_OPERATION_DURATION) in names


@pytest.mark.parametrize("bounds", [semconv.DURATION_BUCKETS, semconv.TOKEN_BUCKETS])
def test_local_aggregation_reports_what_the_sdk_would(bounds: tuple[float, ...]) -> None:
    """The locally aggregated histogram and counter give the data points an SDK histogram
    (same explicit bounds) and counter give for the same measurements, boundary values
    included: bucket i holds (bounds[i-1], bounds[i]]."""
    values = [0.0, *bounds, *(b * 1.5 for b in bounds), bounds[-1] * 10, 0.001]
    attrs = [{"a": "x"}, {"a": "y", "b": 1}]
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    sdk_hist = meter.create_histogram("h", explicit_bucket_boundaries_advisory=bounds)
    sdk_count = meter.create_counter("c")
    local_hist = LocalHistogram("h", "", "", bounds, 0)
    local_count = LocalCounter("c", "", "", 0)
    for i, value in enumerate(values):
        for attributes in attrs[: 1 + i % 2]:
            sdk_hist.record(value, attributes)
            local_hist.record(value, series(attributes))
            sdk_count.add(i, attributes)
            local_count.add(i, series(attributes))
    data = reader.get_metrics_data()
    assert data is not None
    sdk = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}

    def summary(metric: Metric | None) -> list[tuple[Any, ...]]:
        assert metric is not None
        return sorted(
            (
                tuple(sorted(p.attributes.items())),
                tuple(getattr(p, "bucket_counts", ())),
                getattr(p, "sum", None) or getattr(p, "value", None),
                getattr(p, "min", None),
                getattr(p, "max", None),
            )
            for p in points(metric)
        )

    assert summary(local_hist.metric(1)) == summary(sdk["h"])
    assert summary(local_count.metric(1)) == summary(sdk["c"])


def test_gaps_are_finer_than_uvloops_millisecond_clock(caplog: pytest.LogCaptureFixture) -> None:
    """Under uvloop, whose loop.time() moves in whole milliseconds, the cycle still times
    chunks finely: 0.3 ms gaps come out as 0.3 ms, not as 0 or 1 ms."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    telemetry = Telemetry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for step in [ROLE] + [chunk(str(i)) for i in range(20)] + [DONE]:
            until = time.monotonic() + 0.0003
            while time.monotonic() < until:  # busy: a sleep would wait a whole loop turn
                pass
            await send({"type": "http.response.body", "body": step, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def drive() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b'{"model":"m","stream":true}'}

        async def send(message: Any) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        await StreamGuard(app, telemetry=telemetry)(scope, receive, send)

    uvloop.run(drive())
    (line,) = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == semconv.ACCESS_LOGGER
    ]
    assert 0.2 < line["itl_p50_ms"] < 0.9, line
