"""The PrometheusRule (Prometheus Operator) made from the plain rules file, so the two never
drift: `python -m tests.support.promrules --write` rewrites `k8s/observability/
prometheusrule.yaml`; `tests/unit/test_observability_files.py` fails when it differs.

The plain file's `groups:` is copied as text under `spec:`, comments and all.
"""

from __future__ import annotations

import sys
from pathlib import Path

OBSERVABILITY = Path(__file__).parents[2] / "k8s" / "observability"
RULES = OBSERVABILITY / "sidestream-rules.yaml"
PROMETHEUS_RULE = OBSERVABILITY / "prometheusrule.yaml"

HEADER = """\
# Generated from sidestream-rules.yaml by `python -m tests.support.promrules --write`: edit
# that file, not this one. For the Prometheus Operator (kube-prometheus); the `release`
# label is what a default kube-prometheus-stack's ruleSelector matches: set it to yours.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sidestream
  labels:
    app.kubernetes.io/name: sidestream
    release: kube-prometheus-stack
spec:
"""


def prometheus_rule(rules_text: str) -> str:
    """The PrometheusRule manifest holding the groups of `rules_text` (a rules file)."""
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join(f"  {line}\n" if line else "\n" for line in lines[start:])
    return HEADER + body


def main(argv: list[str]) -> int:
    text = prometheus_rule(RULES.read_text())
    if "--write" in argv:
        PROMETHEUS_RULE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
