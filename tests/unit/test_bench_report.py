"""The benchmark report's judgement of a median: its bootstrap interval, the telemetry budget
row that says when a median meets the budget only at the edge of its noise, and issue #52's
budgets: sidestream as shipped (`sidestream`) and stripped down (`sidestream+no-otel`), each
against nginx."""

from __future__ import annotations

import statistics

import pytest

from bench.report import budgets, derive, median_interval

SPREAD = [1.02, 1.20, 1.15, 1.09, 1.24, 1.12, 1.17, 1.06, 1.14, 1.21]  # one run's reps


def test_the_interval_holds_the_median_within_the_values() -> None:
    """Rule: the interval brackets the sample's median and never leaves the values' range."""
    low, high = median_interval(SPREAD)
    assert min(SPREAD) <= low <= statistics.median(SPREAD) <= high <= max(SPREAD)
    assert low < high


def test_the_same_figures_give_the_same_interval() -> None:
    """Rule: seeded: a report printed twice from the same figures shows the same interval."""
    assert median_interval(SPREAD) == median_interval(list(SPREAD))


def test_more_repetitions_of_the_same_spread_narrow_the_interval() -> None:
    """Rule: the interval measures how well the median is known, so four times the repetitions
    of the same spread give a narrower one."""
    low, high = median_interval(SPREAD)
    low4, high4 = median_interval(SPREAD * 4)
    assert high4 - low4 < high - low


def test_one_value_has_no_interval() -> None:
    """Rule: a single repetition cannot say how far its median could be: refused, not 0-wide."""
    with pytest.raises(ValueError):
        median_interval([1.1])


def _telemetry_row(together: list[float]) -> str:
    table = budgets({}, [2000], otel=True, together=together)
    (row,) = [
        r
        for r in table.splitlines()
        if r.startswith("| a. telemetry on: CPU per token ≤ 1.15x off")
    ]
    return row


def test_the_telemetry_budget_row_separates_met_at_the_edge_and_missed() -> None:
    """Rule: met ("yes") only when the median's interval stays within 1.15x; a median within
    it whose interval reaches past is "at the edge"; a median above it is "no"."""
    clear = _telemetry_row([1.08, 1.10, 1.09, 1.11, 1.10])
    assert clear.endswith("| yes |") and "95% interval of the median" in clear
    edge = _telemetry_row([1.10, 1.15, 1.13, 1.19, 1.14, 1.22, 1.12])
    assert edge.endswith("| at the edge |")
    missed = _telemetry_row([1.16, 1.21, 1.18, 1.17, 1.25])
    assert missed.endswith("| **no** |")


@pytest.mark.parametrize(
    ("target", "label", "limit"),
    [
        ("sidestream", "a. as shipped: CPU per token ≤ 1.15x nginx", 1.15),
        ("sidestream+no-otel", "a. telemetry off: CPU per token ≤ 1.05x nginx", 1.05),
    ],
    ids=["as shipped", "telemetry off"],
)
def test_each_cpu_budget_against_nginx_reads_its_own_targets_ratio(
    target: str, label: str, limit: float
) -> None:
    """Rule: issue #52's budget in scenario a is sidestream as shipped's CPU per token at
    1.15x nginx's, and with telemetry off 1.05x: each row reads its own target's ratio,
    whatever the other's is."""
    other = "sidestream+no-otel" if target == "sidestream" else "sidestream"

    def row(ratio: float) -> str:
        med = {target: {"a_cpu_100k_vs_nginx": ratio}, other: {"a_cpu_100k_vs_nginx": 9.0}}
        table = budgets(med, [2000], otel=True, together=[])
        (found,) = [r for r in table.splitlines() if r.startswith(f"| {label} |")]
        return found

    assert row(limit - 0.01).endswith(f"| {limit - 0.01:.2f}x | yes |")
    assert row(limit + 0.06).endswith(f"| {limit + 0.06:.2f}x | **no** |")


def test_the_on_off_ratio_is_as_shipped_over_telemetry_off() -> None:
    """Rule: telemetry's share in a repetition is sidestream as shipped's CPU over
    sidestream+no-otel's, and each CPU figure's ratio to nginx is within its repetition."""
    rep = {
        "nginx": {"a_cpu_100k": 2.0},
        "sidestream": {"a_cpu_100k": 2.6},
        "sidestream+no-otel": {"a_cpu_100k": 2.0},
    }
    derive(rep)
    assert rep["sidestream"]["a_cpu_100k_otel"] == pytest.approx(1.3)
    assert rep["sidestream"]["a_cpu_100k_vs_nginx"] == pytest.approx(1.3)
    assert rep["sidestream+no-otel"]["a_cpu_100k_vs_nginx"] == pytest.approx(1.0)
    assert "a_cpu_100k_otel" not in rep["sidestream+no-otel"]
