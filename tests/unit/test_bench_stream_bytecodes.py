"""`bench.lab.stream_bytecodes` splits each function's bytecodes into per token and per stream."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.lab.stream_bytecodes import rates


def test_per_token_is_the_slope_and_per_stream_the_rest() -> None:
    """Rule: with 10 streams of 5 and of 55 tokens, a function that runs 3 bytecodes a token
    and 40 a stream counts 3 per token and 40 per stream; one that runs only per stream, or
    only in one of the loads, is split by the same line."""
    streams, tokens = 10, (5, 55)

    def load(t: int) -> Counter[str]:
        return Counter({"token_and_stream": streams * (40 + 3 * t), "stream_only": streams * 7})

    short, long = load(tokens[0]), load(tokens[1])
    long["long_only"] = 500
    table = rates(short, long, streams, tokens)
    assert table["token_and_stream"] == pytest.approx((3.0, 40.0))
    assert table["stream_only"] == pytest.approx((0.0, 7.0))
    assert table["long_only"] == pytest.approx((1.0, -5.0))
