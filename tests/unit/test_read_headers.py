"""`http1.connection.read_headers`: a request's headers read at once, in place, as
uvicorn's `on_header` reads them one by one (its httptools protocol, the release installed):
names lower-cased, the blanks llhttp keeps after a value dropped, `expect: 100-continue`
noticed. Both twins — Python (`sidecar.head_rules.read_headers`) and compiled
(`sidecar/_heads.c`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httptools
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sidecar import head_rules
from sidecar.servers.http1 import connection
from tests.support.fuzzing import examples

Reader = Callable[[list[tuple[bytes, bytes]]], bool]


def _twins() -> list[Reader]:
    try:
        compiled: Reader = importlib.import_module("sidecar._heads").read_headers
    except ImportError:
        pytest.fail("the compiled twin is not built: `make install` builds it (needs gcc)")
    return [head_rules.read_headers, compiled]


def uvicorns(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """What uvicorn's own `on_header` makes of these headers, called once for each."""
    protocol: Any = SimpleNamespace(headers=[], expect_100_continue=False)
    for name, value in headers:
        HttpToolsProtocol.on_header(protocol, name, value)
    return protocol.headers, protocol.expect_100_continue


_NAMES = st.sampled_from([b"Host", b"EXPECT", b"expect", b"Content-Type", b"x-a", b"X-\xc3\x89"])
_VALUES = st.sampled_from(
    [b"100-continue", b"100-Continue \t", b"100-continue,", b" x ", b"a\t", b"", b"\t \t"]
) | st.binary(max_size=6)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), min_size=1, max_size=8))
@example([(b"Expect", b"100-CONTINUE  ")])
@example([(b"host", b"a")])
def test_each_twin_reads_headers_as_uvicorn_does(headers: list[tuple[bytes, bytes]]) -> None:
    """Any casing, trailing blanks or none, `expect` with and without 100-continue: the
    same headers in the same order, and the same answer to "expect 100-continue?"."""
    expected = uvicorns(headers)
    for twin in _twins():
        read = list(headers)
        assert (read, twin(read)) == expected


def test_an_unusual_list_gets_the_python_twins_reading() -> None:
    """Pairs that are lists, not tuples, are read as uvicorn would read them, by both twins."""
    python, compiled = _twins()
    odd: list[Any] = [[b"Host", b"a "], [b"Expect", b"100-continue"]]
    a, b = [list(pair) for pair in odd], [list(pair) for pair in odd]
    assert (
        (compiled(b), b)
        == (python(a), a)
        == (True, [(b"host", b"a"), (b"expect", b"100-continue")])
    )


_TARGET_BYTES = st.sampled_from(list(b"/?#%:@!$&'()*+,;=-._~aZ09 \t\x00\x7f\x80\xff\"<>[]{}|\\^`"))


@settings(max_examples=examples(500), deadline=None)
@given(
    st.binary(max_size=3).map(lambda b: b"/" + b) | st.lists(_TARGET_BYTES, max_size=12).map(bytes)
)
@example(b"/v1/chat/completions")
@example(b"/a?b=1#c")
@example(b"http://other.example/x?y")
@example(b"*")
def test_a_target_is_read_as_httptools_parse_url_reads_it(url: bytes) -> None:
    """Path and query string as uvicorn takes them from `httptools.parse_url` (b"" for no
    query), or `parse_url`'s own error for a target it refuses."""
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        with pytest.raises(httptools.HttpParserInvalidURLError):
            connection.target(url)
        return
    assert connection.target(url) == (parsed.path, parsed.query or b"")
