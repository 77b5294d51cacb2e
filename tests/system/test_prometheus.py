"""The dashboard and the alert rules against a real Prometheus (Debian's `prometheus`, which
`make test-deps` installs; missing is a failure, not a skip).

One sidecar process in front of the emulator (plus a 500, a 429 and a flood,
`promlab.FaultyEmulator`), a Prometheus scraping its admin /metrics every second with the
rules loaded (a test-only copy whose `for:` is 0 s), and two rounds of traffic of every
outcome. Then: `promtool check rules`; every dashboard query and every rule expression
returns data through the HTTP API; `promtool test rules` passes its unit tests; the alerts
the traffic deserves fire in the live Prometheus and the others stay quiet; and a drain's
refusals reach Prometheus before the process exits.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from sidecar.emulator import Stats, make_app
from tests.support import dashboard, promrules
from tests.support.clients import request
from tests.support.procs import Child, get
from tests.support.promlab import (
    MODELS,
    SIDECAR_FLAGS,
    FaultyEmulator,
    Prometheus,
    chat,
    every_outcome,
    prometheus,
)
from tests.support.servers import serve
from tests.support.tools import tool

pytestmark = pytest.mark.asyncio(loop_scope="module")

RULES_TEST = Path(__file__).parents[1] / "support" / "prometheus" / "rules_test.yml"
# Every outcome `every_outcome` makes; a drain's (rejected_draining, shutdown) come last.
OUTCOMES = {
    "completed",
    "client_disconnected",
    "first_token_timeout",
    "idle_timeout",
    "max_duration",
    "slow_client",
    "upstream_error",
    "rate_limited",
    "rejected_overload",
}
# What that traffic should fire, with `for: 0s`, and what it should not.
FIRING = {
    "SidestreamRejectingOverload",
    "SidestreamIdleTimeoutsRising",
    "SidestreamFirstTokenTimeoutsRising",
    "SidestreamUpstreamErrors",
}
QUIET = {"SidestreamTimeToFirstTokenHigh", "SidestreamNoTraffic"}


@dataclass
class Lab:
    prometheus: Prometheus
    sidecar: Child
    overload: list[int]


def promtool() -> str:
    return tool("promtool")


async def run(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(errors="replace")


def quick_rules(directory: Path) -> Path:
    """The rules file with every `for:` at 0 s, for a Prometheus that has seconds of data."""
    rules = yaml.safe_load(promrules.RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    path = directory / "sidestream-rules-quick.yaml"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    rules = quick_rules(tmp_path_factory.mktemp("rules"))
    async with serve(FaultyEmulator(make_app(stats=Stats()))) as upstream:
        sidecar = Child(upstream, *SIDECAR_FLAGS)
        try:
            await sidecar.ready()
            async with prometheus([f"127.0.0.1:{sidecar.admin}"], [rules]) as server:
                await until(lambda: server.scrapes(), 2)
                overload = await every_outcome(sidecar.port)
                await asyncio.sleep(3)  # a few scrapes between the rounds: rates above zero
                overload += await every_outcome(sidecar.port)
                await asyncio.sleep(3)
                yield Lab(server, sidecar, overload)
        finally:
            sidecar.kill()


async def until(probe: object, at_least: int, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await probe() >= at_least:  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{probe} did not reach {at_least} in {timeout} s")


async def test_promtool_checks_the_rules_files() -> None:
    """`promtool check rules` accepts the plain rules file and the PrometheusRule's groups."""
    code, out = await run(promtool(), "check", "rules", str(promrules.RULES))
    assert code == 0, out
    assert "SUCCESS: 6 rules found" in out


async def test_promtool_unit_tests_fire_each_alert_and_spare_healthy_pods() -> None:
    """`promtool test rules`: each alert fires on its synthetic sick series, with its summary
    and description, and never for the healthy pod beside it."""
    code, out = await run(promtool(), "test", "rules", str(RULES_TEST))
    assert code == 0, out
    assert "SUCCESS" in out


async def test_the_traffic_had_every_outcome(lab: Lab) -> None:
    """Prometheus holds a series for every outcome the traffic made; the overload was refused."""
    assert lab.overload and set(lab.overload) == {503}
    found = await lab.prometheus.query("sum by (sidestream_outcome) (sidestream_streams_total)")
    assert {s["metric"]["sidestream_outcome"] for s in found} >= OUTCOMES


async def test_every_dashboard_query_returns_data(lab: Lab) -> None:
    """Each panel's PromQL, variables as Grafana substitutes them ("All", a 1 m rate window),
    parses and returns a non-empty vector of numbers; the outcome panel has every outcome and
    the variables' label_values find the pod and both models."""
    empty = []
    for query in dashboard.queries():
        result = await lab.prometheus.query(query.promql)
        values = [float(s["value"][1]) for s in result]
        if not values or all(v != v for v in values):  # none, or only NaN
            empty.append(f"{query.panel} [{query.legend}]: {query.promql}")
    assert not empty, "\n".join(empty)

    outcome_panel = next(q for q in dashboard.queries() if q.panel == "Streams by outcome")
    result = await lab.prometheus.query(outcome_panel.promql)
    assert {s["metric"]["sidestream_outcome"] for s in result} >= OUTCOMES

    for name, (metric, label) in dashboard.variable_queries().items():
        values = await lab.prometheus.api(f"label/{label}/values", **{"match[]": metric})
        expected = {"sidestream-test"} if name == "pod" else set(MODELS)
        assert set(values) >= expected, (name, values)


def satisfiable(expr: str) -> str:
    """`expr` with its thresholds made true (`> 10` -> `>= 0`), to show its series exist."""
    return re.sub(r"(>|==)\s*[0-9.]+", ">= 0", expr)


async def test_every_rule_expression_returns_data(lab: Lab) -> None:
    """Each alert's expression, threshold aside, parses and finds the sidecar's series."""
    rules = yaml.safe_load(promrules.RULES.read_text())["groups"][0]["rules"]
    empty = []
    for rule in rules:
        if not await lab.prometheus.query(satisfiable(rule["expr"])):
            empty.append(rule["alert"])
    assert not empty


async def test_alerts_fire_in_the_live_prometheus(lab: Lab) -> None:
    """With `for: 0s`: rejections by --max-streams, idle and first-token timeouts and upstream
    errors fire for the test pod; TTFT (p99 well under 10 s) and no-traffic stay quiet."""

    async def firing() -> set[str]:
        alerts = (await lab.prometheus.api("alerts"))["alerts"]
        return {
            a["labels"]["alertname"]
            for a in alerts
            if a["state"] == "firing" and a["labels"].get("pod") == "sidestream-test"
        }

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    names = await firing()
    while not names >= FIRING and loop.time() < deadline:
        await asyncio.sleep(0.5)
        names = await firing()
    assert names >= FIRING
    assert not names & QUIET


async def test_a_drain_reaches_prometheus_before_the_exit(lab: Lab) -> None:
    """POST /drain with a long stream in flight: a new request is refused
    (rejected_draining) and Prometheus scrapes that before the sidecar exits; the long stream
    is ended at --drain-timeout (shutdown), and the process exits 0. Runs last."""
    held = await request(
        lab.sidecar.port, "POST", "/v1/chat/completions", body=chat(tokens=200, itl_ms=50)
    )
    await held.chunk()
    status, _, _ = await get(lab.sidecar.admin, "/drain", "POST")
    assert status == 202
    refused, _, _ = await get(lab.sidecar.port, "/v1/chat/completions", "POST", chat())
    assert refused == 503

    async def drained() -> int:
        query = 'sidestream_streams_total{sidestream_outcome="rejected_draining"}'
        return len(await lab.prometheus.query(query))

    await until(drained, 1, timeout=5)
    await held.body()
    held.close()
    assert await lab.sidecar.exit_code(10) == 0
