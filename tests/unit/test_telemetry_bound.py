"""The metrics sink's resolved series: each GenAI attribute set's aggregations are looked up
once and recorded into directly, with the same points as recording by key."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from middleware.telemetry import semconv
from middleware.telemetry.gaps import ChunkHistogram, Gaps
from middleware.telemetry.instruments import LocalCounter, LocalHistogram, series
from middleware.telemetry.kinds import STREAM
from middleware.telemetry.sinks import metrics


def instruments() -> dict[str, Any]:
    def histogram(name: str, bounds: tuple[float, ...]) -> LocalHistogram:
        return LocalHistogram(name, "s", "", bounds, 0)

    return dict(
        duration=histogram(semconv.METRIC_OPERATION_DURATION, semconv.DURATION_BUCKETS),
        ttfc=histogram(semconv.METRIC_TIME_TO_FIRST_CHUNK, semconv.DURATION_BUCKETS),
        chunks=ChunkHistogram(0),
        token_usage=histogram(semconv.METRIC_TOKEN_USAGE, semconv.TOKEN_BUCKETS),
        streams=LocalCounter(semconv.METRIC_STREAMS, "", "", 0),
        keepalives=LocalCounter(semconv.METRIC_KEEPALIVES, "", "", 0),
        cancellations=LocalCounter(semconv.METRIC_CANCELLATIONS, "", "", 0),
        cancel_latency=histogram(semconv.METRIC_CANCEL_LATENCY, semconv.DURATION_BUCKETS),
    )


def summary(model: str, i: int) -> Any:
    """What the metrics sink reads of a stream's summary; `i` varies its values."""
    gaps = Gaps()
    for n in range(i % 5 + 2):
        gaps.add(10.0 + n * 0.01 * (i + 1))
    gaps.seal()
    return SimpleNamespace(
        genai=True,
        kind=STREAM,
        series={semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: model},
        error_type="idle_timeout" if i % 7 == 3 else None,
        duration=0.5 + i,
        streaming=True,
        ttft=None if i % 3 == 0 else 0.01 * i,
        gaps=gaps,
        input_tokens=None if i % 4 == 0 else 9,
        output_tokens=i * 10,
        outcome_value="idle_timeout" if i % 7 == 3 else "completed",
        keepalives=0,
        aborted_at=None,
        cancel_latency=None,
    )


def by_key(made: dict[str, Any], s: Any) -> None:
    """The sink's measurements of `s`, recorded by key (as before series were resolved)."""
    key = series(s.series)
    duration_key = (
        key if s.error_type is None else series({**s.series, semconv.ERROR_TYPE: s.error_type})
    )
    made["duration"].record(s.duration, duration_key)
    if s.ttft is not None:
        made["ttfc"].record(s.ttft, key)
    made["chunks"].fold(s.gaps, key)
    for kind, tokens in (("input", s.input_tokens), ("output", s.output_tokens)):
        if tokens is not None:
            typed = series({**s.series, semconv.GEN_AI_TOKEN_TYPE: kind})
            made["token_usage"].record(tokens, typed)
    made["streams"].add(1, ((semconv.OUTCOME, s.outcome_value),))


def points(made: dict[str, Any]) -> dict[str, list[Any]]:
    """Each instrument's points, by attribute set, as collected (timestamps left out)."""
    out: dict[str, list[Any]] = {}
    for name, instrument in made.items():
        metric = instrument.metric(1)
        if metric is None:
            continue
        out[name] = sorted(
            (
                sorted(p.attributes.items()),
                getattr(p, "count", None),
                getattr(p, "sum", None),
                list(getattr(p, "bucket_counts", ())),
                getattr(p, "value", None),
            )
            for p in metric.data.data_points
        )
    return out


def test_a_series_resolved_but_not_recorded_into_is_no_point() -> None:
    """A series `series_of` made is collected only once a value is recorded into it: what
    the metrics sink resolves ahead (a stream without a first chunk, say) adds no point."""
    histogram = LocalHistogram("h", "s", "", (1.0, 2.0), 0)
    buckets = histogram.series_of(series({"a": "b"}))
    assert histogram.metric(1) is None
    histogram.record_in(buckets, 1.5)
    histogram.record(0.5, series({"a": "b"}))
    metric = histogram.metric(1)
    assert metric is not None
    (point,) = metric.data.data_points  # type: ignore[union-attr]
    assert (point.count, list(point.bucket_counts)) == (2, [1, 1, 0])  # type: ignore[union-attr]


@pytest.mark.parametrize("most", [1024, 2])
def test_the_sink_records_what_recording_by_key_records(
    monkeypatch: pytest.MonkeyPatch, most: int
) -> None:
    """Streams of several models, with and without a first chunk, usage or an error, give
    the same points through the sink's resolved series as recorded by key, also when more
    attribute sets come than it keeps resolved (`BOUND_MOST`)."""
    monkeypatch.setattr(metrics, "BOUND_MOST", most)
    through_sink, expected = instruments(), instruments()
    sink = metrics.MetricsSink(**through_sink)
    for i in range(40):
        s = summary(f"model-{i % 5}", i)
        sink.emit(s)
        by_key(expected, summary(f"model-{i % 5}", i))
    assert len(sink._bound) <= most
    got, want = points(through_sink), points(expected)
    assert set(got) == set(want) == {"duration", "ttfc", "chunks", "token_usage", "streams"}
    assert got == want
