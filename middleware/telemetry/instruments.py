"""Per-stream metrics aggregated by sidestream itself and handed to the SDK at collection.

An SDK `Histogram.record` or `Counter.add` hashes the attributes and matches views once per
metric reader, and a stream records up to eight measurements at its end: together more than
a hundred relayed tokens cost. So the per-stream instruments live here: cumulative
aggregations per attribute set, updated under a lock (collection runs in the reader's
thread), turned into SDK `Metric` data at every collection and export (`Telemetry.metrics`
and the exporter wrapper, `WithLocal`) — the points the SDK's own cumulative aggregation with these
bucket boundaries would report.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from middleware.telemetry import otel_sdk, semconv

Attributes = Mapping[str, str | int]
Key = tuple[tuple[str, str | int], ...]


def series(attributes: Attributes) -> Key:
    """The key of the series `attributes` name: what the instruments here take, made once per
    attribute set (a stream's measurements share most of theirs) instead of per update."""
    return tuple(sorted(attributes.items()))


class _Buckets:
    __slots__ = ("count", "counts", "max", "min", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf


class _Local:
    """What the local instruments share: name, unit, description, start time, the lock, and
    the SDK `Metric` made at collection from the subclass's points (None while it has none)."""

    def __init__(self, name: str, unit: str, description: str, start_ns: int) -> None:
        self.name, self.unit, self.description = name, unit, description
        self._start = start_ns
        self._lock = threading.Lock()

    def metric(self, now_ns: int) -> Metric | None:
        with self._lock:
            points = self._points(now_ns)
        if not points:
            return None
        data = self._data(points)
        return Metric(name=self.name, description=self.description, unit=self.unit, data=data)

    def _points(self, now_ns: int) -> list[Any]:
        """One SDK data point per attribute set, read under the lock."""
        raise NotImplementedError

    def _data(self, points: list[Any]) -> Histogram | Sum:
        raise NotImplementedError


class LocalHistogram(_Local):
    """A cumulative explicit-bucket histogram: bucket i holds (bounds[i-1], bounds[i]]."""

    def __init__(
        self, name: str, unit: str, description: str, bounds: Sequence[float], start_ns: int
    ) -> None:
        super().__init__(name, unit, description, start_ns)
        self.bounds = list(bounds)
        self._series: dict[Key, _Buckets] = {}

    def record(self, value: float, key: Key) -> None:
        """Add one value to the series `key` (see `series`)."""
        buckets = self._series.get(key)
        self.record_in(buckets if buckets is not None else self.series_of(key), value)

    def series_of(self, key: Key) -> _Buckets:
        """The series `key`'s aggregation (made now when new), for `record_in`: a caller that
        records into the same series stream after stream resolves it once (the series are
        cumulative: never dropped, so it stays the one collected)."""
        with self._lock:
            return self._series.get(key) or self._new(key)

    def record_in(self, buckets: _Buckets, value: float) -> None:
        """Add one value to a series `series_of` gave."""
        index = bisect.bisect_left(self.bounds, value)
        with self._lock:
            buckets.counts[index] += 1
            buckets.count += 1
            buckets.total += value
            if value < buckets.min:
                buckets.min = value
            if value > buckets.max:
                buckets.max = value

    def merge(
        self,
        key: Key,
        counts: Mapping[int, int],
        count: int,
        total: float,
        low: float,
        high: float,
    ) -> None:
        """Add `count` values summing to `total`, within [low, high], bucketed as `counts`."""
        with self._lock:
            buckets = self._series.get(key) or self._new(key)
            for index, n in counts.items():
                buckets.counts[index] += n
            buckets.count += count
            buckets.total += total
            buckets.min = min(buckets.min, low)
            buckets.max = max(buckets.max, high)

    def _new(self, key: Key) -> _Buckets:
        buckets = self._series[key] = _Buckets(len(self.bounds) + 1)
        return buckets

    def _points(self, now_ns: int) -> list[Any]:
        return [
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=self._start,
                time_unix_nano=now_ns,
                count=s.count,
                sum=s.total,
                bucket_counts=list(s.counts),
                explicit_bounds=list(self.bounds),
                min=s.min,
                max=s.max,
            )
            for key, s in self._series.items()
            if s.count  # resolved (`series_of`) but not recorded into yet: not a point
        ]

    def _data(self, points: list[Any]) -> Histogram:
        return Histogram(
            data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
        )


class LocalCounter(_Local):
    """A cumulative monotonic sum per attribute set."""

    def __init__(self, name: str, unit: str, description: str, start_ns: int) -> None:
        super().__init__(name, unit, description, start_ns)
        self._sums: dict[Key, int] = {}

    def add(self, amount: int, key: Key = ()) -> None:
        """Add `amount` to the series `key` (see `series`; none: the one without attributes)."""
        with self._lock:
            self._sums[key] = self._sums.get(key, 0) + amount

    def _points(self, now_ns: int) -> list[Any]:
        return [
            NumberDataPoint(
                attributes=dict(key),
                start_time_unix_nano=self._start,
                time_unix_nano=now_ns,
                value=value,
            )
            for key, value in self._sums.items()
        ]

    def _data(self, points: list[Any]) -> Sum:
        return Sum(
            data_points=points,
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=True,
        )


class WithLocal(MetricExporter):
    """A metric exporter that adds the locally aggregated metrics (`local()`, as collected
    now) to every export."""

    def __init__(self, inner: MetricExporter, local: Callable[[], list[Metric]]) -> None:
        super().__init__(**otel_sdk.metric_preferences(inner))
        self._inner = inner
        self._local = local

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        local = self._local()
        if local:
            metrics_data = MetricsData(resource_metrics=list(_with(metrics_data, local)))
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _with(data: MetricsData, local: list[Metric]) -> Iterator[ResourceMetrics]:
    """`data` with `local` in sidestream's scope (added when this export has none)."""
    for i, rm in enumerate(data.resource_metrics):
        scopes = list(rm.scope_metrics)
        mine = [j for j, sm in enumerate(scopes) if sm.scope.name == semconv.INSTRUMENTATION_SCOPE]
        if mine:
            sm = scopes[mine[0]]
            scopes[mine[0]] = ScopeMetrics(sm.scope, [*sm.metrics, *local], sm.schema_url)
        elif i == 0:
            scope = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE)
            scopes.append(ScopeMetrics(scope, local, ""))
        yield ResourceMetrics(rm.resource, scopes, rm.schema_url)
