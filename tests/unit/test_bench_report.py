"""The benchmark report's judgement of a median: its bootstrap interval, and the telemetry
budget rows: the one that says when a median meets the budget only at the edge of its noise,
and issue #31's telemetry-on budget against nginx."""

from __future__ import annotations

import statistics

import pytest

from bench.report import budgets, median_interval

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


def test_the_telemetry_budget_against_nginx_reads_the_otel_targets_ratio() -> None:
    """Rule: issue #31's telemetry-on budget is sidestream+otel's CPU per token against
    nginx's, met at 1.25x or below, whatever sidestream's own ratio is."""

    def row(ratio: float) -> str:
        med = {"sidestream": {"a_cpu_100k_vs_nginx": 1.0}, "sidestream+otel": {}}
        med["sidestream+otel"]["a_cpu_100k_vs_nginx"] = ratio
        table = budgets(med, [2000], otel=True, together=[])
        (found,) = [r for r in table.splitlines() if "≤ 1.25x nginx" in r]
        return found

    assert row(1.24).endswith("| 1.24x | yes |")
    assert row(1.31).endswith("| 1.31x | **no** |")
