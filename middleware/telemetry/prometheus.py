"""Prometheus text exposition (format 0.0.4) of the SDK's collected metrics, hand-written.

A few instruments do not justify `prometheus_client` plus the OTel Prometheus exporter.
Names follow the OpenTelemetry-to-Prometheus rules: dots become underscores, the unit is
appended (`s` -> `_seconds`, `{...}` annotations dropped), monotonic sums end in `_total`,
histograms expose cumulative `_bucket{le=...}`, `_sum` and `_count`. Resource attributes are
not repeated on every series.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from opentelemetry.sdk.metrics.export import Gauge, Histogram, Metric, Sum

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}


def metric_name(name: str, unit: str | None, *, counter: bool = False) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNITS.get(unit or "", "")
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if counter and not base.endswith("_total"):
        base += "_total"
    return base


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return repr(float(value))


def _escape(value: object) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(attributes: Mapping[str, object] | None, extra: str = "") -> str:
    parts = [
        f'{_INVALID.sub("_", k)}="{_escape(v)}"' for k, v in sorted((attributes or {}).items())
    ]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def exposition(metrics: Iterable[Metric], *, skip: frozenset[str] = frozenset()) -> list[str]:
    """Lines of text exposition for `metrics` (those named in `skip` are left out)."""
    lines: list[str] = []
    for metric in metrics:
        if metric.name in skip:
            continue
        data = metric.data
        if isinstance(data, Histogram):
            name = metric_name(metric.name, metric.unit)
            _header(lines, name, metric.description, "histogram")
            for point in data.data_points:
                cumulative = 0
                for bound, count in zip(
                    [*point.explicit_bounds, math.inf], point.bucket_counts, strict=True
                ):
                    cumulative += count
                    le = f'le="{_number(bound)}"'
                    lines.append(f"{name}_bucket{_labels(point.attributes, le)} {cumulative}")
                labels = _labels(point.attributes)
                lines.append(f"{name}_sum{labels} {_number(point.sum)}")
                lines.append(f"{name}_count{labels} {point.count}")
        elif isinstance(data, (Sum, Gauge)):
            counter = isinstance(data, Sum) and data.is_monotonic
            name = metric_name(metric.name, metric.unit, counter=counter)
            _header(lines, name, metric.description, "counter" if counter else "gauge")
            for number in data.data_points:
                lines.append(f"{name}{_labels(number.attributes)} {_number(number.value)}")
    return lines


def _header(lines: list[str], name: str, description: str | None, kind: str) -> None:
    if description:
        lines.append(f"# HELP {name} {description.replace(chr(10), ' ')}")
    lines.append(f"# TYPE {name} {kind}")
