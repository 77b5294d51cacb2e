"""k8s/observability: the PrometheusRule is the plain rules file's groups (they cannot
drift), every alert says what to check, and every metric the dashboard and the rules name is
one sidestream exports. That the queries return data from a real Prometheus is
tests/system/test_prometheus.py."""

from __future__ import annotations

import re

import yaml

from middleware.telemetry import semconv
from middleware.telemetry.prometheus import metric_name
from tests.support import dashboard, promrules

# What the admin /metrics serves, by the exposition's naming rules (`prometheus.metric_name`).
HISTOGRAMS = {
    metric_name(semconv.METRIC_OPERATION_DURATION, "s"),
    metric_name(semconv.METRIC_TIME_TO_FIRST_CHUNK, "s"),
    metric_name(semconv.METRIC_TIME_PER_OUTPUT_CHUNK, "s"),
    metric_name(semconv.METRIC_TOKEN_USAGE, "{token}"),
    metric_name(semconv.METRIC_CANCEL_LATENCY, "s"),
}
COUNTERS = {
    metric_name(semconv.METRIC_STREAMS, "{stream}", counter=True),
    metric_name(semconv.METRIC_KEEPALIVES, "{keepalive}", counter=True),
    metric_name(semconv.METRIC_CANCELLATIONS, "{stream}", counter=True),
}
EXPORTED = (
    {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | COUNTERS
    | {metric_name(semconv.METRIC_ACTIVE_STREAMS, "{stream}")}
)
METRIC = re.compile(r"\b(gen_ai_[a-z_]+|sidestream_[a-z_]+)\b")
# Label names, which look like metric names: the attributes', dots made underscores.
LABELS = {
    name.replace(".", "_")
    for key, name in vars(semconv).items()
    if not key.startswith("METRIC_")
    and isinstance(name, str)
    and name.startswith(("gen_ai.", "sidestream."))
}


def rules() -> list[dict[str, object]]:
    text = promrules.RULES.read_text()
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def test_prometheus_rule_is_generated_from_the_plain_rules_file() -> None:
    """prometheusrule.yaml is exactly what `python -m tests.support.promrules --write` makes
    of sidestream-rules.yaml: the same groups, so the two installs alert alike."""
    plain = promrules.RULES.read_text()
    operator = promrules.PROMETHEUS_RULE.read_text()
    assert operator == promrules.prometheus_rule(plain)
    manifest = yaml.safe_load(operator)
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == yaml.safe_load(plain)["groups"]


def test_every_alert_says_what_to_check() -> None:
    """Each alert has a severity, a summary and a description that names something to check."""
    names = set()
    for rule in rules():
        names.add(rule["alert"])
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["summary"] and "Check" in annotations["description"], rule["alert"]
        assert rule["labels"] == {"severity": rule["labels"]["severity"]}  # type: ignore[index]
    assert names == {
        "SidestreamTimeToFirstTokenHigh",
        "SidestreamIdleTimeoutsRising",
        "SidestreamFirstTokenTimeoutsRising",
        "SidestreamUpstreamErrors",
        "SidestreamRejectingOverload",
        "SidestreamNoTraffic",
    }


def test_dashboard_and_rules_name_only_exported_metrics() -> None:
    """Every metric named in a panel, a variable or a rule is one the admin /metrics serves."""
    named = {q.expr for q in dashboard.queries()}
    named |= {f"{m}" for m, _ in dashboard.variable_queries().values()}
    named |= {str(r["expr"]) for r in rules()}
    used = {m for text in named for m in METRIC.findall(text)} - LABELS
    assert used and used <= EXPORTED, used - EXPORTED


def test_dashboard_has_its_variables_and_panels() -> None:
    """A datasource variable, pod and model variables; every panel queries through
    `${datasource}`; the stream's story is there."""
    board = dashboard.load()
    variables = {v["name"]: v["type"] for v in board["templating"]["list"]}
    assert variables == {"datasource": "datasource", "pod": "query", "model": "query"}
    titles = [p["title"] for p in board["panels"]]
    for wanted in (
        "Time to first token",
        "Inter-chunk gap",
        "Output tokens per second",
        "Streams by outcome",
        "Active streams",
        "Keep-alives sent",
        "Cancel latency",
    ):
        assert wanted in titles
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all('pod=~"$pod"' in t["expr"] for t in panel["targets"]), panel["title"]
