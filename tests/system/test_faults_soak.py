"""The soak's short version: a few seconds of mixed traffic with aborts and upstream failures.

`make soak` runs the same code for minutes at a few hundred streams (bench/soak.py).
"""

from __future__ import annotations

from bench.soak import soak


async def test_short_soak_leaks_nothing_and_accounts_for_every_request() -> None:
    """Mixed traffic (10% client aborts, 5% upstream failures, slow readers): RSS, fds and tasks
    return to the baseline, every request has exactly the one outcome its kind implies, and
    every client saw a well-formed end."""
    report = await soak(4.0, 40, warmup=1.5)
    assert report.problems == [], report.as_dict()
    assert sum(report.requests.values()) > 100
    assert set(report.requests) == {"normal", "slow", "abort", "upstream_failure"}
