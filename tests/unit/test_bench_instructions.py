"""`bench.lab.instructions`' arithmetic: the per-token slope and the per-stream rest. Its count
of the cyclic collector's passes under valgrind, which it shows apart because whether a pass
lands in a load is chance, runs a child process: tests/system/test_bench_callgrind.py."""

from __future__ import annotations

from bench.lab.instructions import line


def test_the_slope_is_per_token_and_the_rest_per_stream() -> None:
    """Rule: two loads of 10 streams, of 5 and 205 tokens, costing 1,000 a token and 60,000 a
    stream, give back exactly those two figures."""
    a = 10 * (60_000 + 5 * 1_000)
    b = 10 * (60_000 + 205 * 1_000)
    assert line(a, b, 10, 5, 205) == (1_000, 60_000)
