"""The Grafana dashboard's queries, ready for Prometheus: variables substituted as Grafana
would with "All" selected. Shared by the Prometheus system test and the dashboard rendering
(`tests/support/render_dashboard.py`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).parents[2] / "k8s" / "observability" / "sidestream-dashboard.json"
# "All" for the pod and model variables; a rate window of four 1 s scrapes and more.
VARIABLES = {"$__rate_interval": "1m", "$pod": ".*", "$model": ".*"}


@dataclass(frozen=True)
class Query:
    panel: str
    legend: str
    expr: str  # as written in the dashboard
    unit: str

    @property
    def promql(self) -> str:
        expr = self.expr
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        return expr


def load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def queries(dashboard: dict[str, Any] | None = None) -> list[Query]:
    """Every panel's every query, in panel order."""
    board = dashboard if dashboard is not None else load()
    return [
        Query(
            panel["title"],
            target.get("legendFormat", ""),
            target["expr"],
            panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
        )
        for panel in board["panels"]
        for target in panel["targets"]
    ]


def variable_queries(dashboard: dict[str, Any] | None = None) -> dict[str, tuple[str, str]]:
    """The query variables' `label_values(metric, label)`: name -> (metric, label)."""
    board = dashboard if dashboard is not None else load()
    found: dict[str, tuple[str, str]] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        text = variable["query"]["query"]
        inner = text.removeprefix("label_values(").removesuffix(")")
        metric, label = (part.strip() for part in inner.split(","))
        found[variable["name"]] = (metric, label)
    return found
