"""`sidecar.servers.response_head`: the response head the sidecar's HTTP/1.1 protocol writes
is the one uvicorn's httptools protocol writes for the same `http.response.start`, byte for
byte, with the same framing decided, and the same error raised for a head uvicorn refuses.

Each case runs the message through uvicorn's own `RequestResponseCycle.send` (the release
installed, the one the gate checks) on a transport that records what is written, and through
each twin of `response_head` (Python, `sidecar.head_rules`, and compiled: `sidecar/_heads.c`);
they must agree.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from sidecar import head_rules
from tests.support.fuzzing import examples

Head = Callable[..., Any]


@pytest.fixture(params=["python", "compiled"])
def head(request: pytest.FixtureRequest) -> Head:
    """Each twin, whichever one `SIDESTREAM_NO_EXTENSIONS` picks for the rest of the suite."""
    if request.param == "python":
        return head_rules.response_head
    try:
        compiled: Head = importlib.import_module("sidecar._heads").response_head
    except ImportError:
        pytest.fail("the compiled twin is not built: `make install` builds it (needs gcc)")
    return compiled


class Transport:
    """What uvicorn's cycle calls of a transport, recorded."""

    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:  # a bad head: uvicorn's caller closes; not here
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def uvicorns(status: Any, headers: Any, *, keep_alive: bool, method: str) -> object:
    """What uvicorn's own `send` makes of this start: (head, chunked, length, keep-alive),
    or the error it raises as (type, message)."""
    transport = Transport()
    cycle = RequestResponseCycle(
        scope={"type": "http", "method": method, "http_version": "1.1"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    message = {"type": "http.response.start", "status": status, "headers": headers}
    try:
        asyncio.run(cycle.send(message))  # type: ignore[arg-type]
    except Exception as exc:
        return type(exc), str(exc)
    return (
        transport.written,
        cycle.chunked_encoding,
        cycle.expected_content_length,
        cycle.keep_alive,
    )


def ours(head: Head, status: Any, headers: Any, *, keep_alive: bool, method: str) -> object:
    try:
        return head(status, headers, keep_alive, method == "HEAD")
    except Exception as exc:
        return type(exc), str(exc)


def agree(
    head: Head, status: Any, headers: Any, *, keep_alive: bool = True, method: str = "POST"
) -> object:
    theirs = uvicorns(status, headers, keep_alive=keep_alive, method=method)
    assert ours(head, status, headers, keep_alive=keep_alive, method=method) == theirs
    return theirs


SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@pytest.mark.parametrize("byte", range(256))
def test_a_header_name_or_value_is_refused_for_the_bytes_uvicorn_refuses(
    head: Head, byte: int
) -> None:
    """Every byte, in a name and in a value (with good headers around it): refused with
    uvicorn's error exactly when uvicorn refuses it, else the same head."""
    char = bytes([byte])
    agree(head, 200, [*SSE, (b"x-" + char + b"y", b"1"), (b"x-z", b"2")])
    agree(head, 200, [*SSE, (b"x-a", b"v" + char + b"w"), (b"x-z", b"2")])


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-a", b"1\n"), (b"x b", b"2")],  # a bad value before a bad name: the value's error
        [(b"x b", b"1"), (b"x-a", b"2\n")],  # and the other way round
        [(b"content-length", b"abc"), (b"x-a", b"\x00")],  # a bad length first: int()'s error
        [(b"content-length", b"12"), (b"x-a", b"\x7f")],
        [(b"x-a", b"\r")],
        [(b"", b"empty name")],
    ],
)
def test_the_first_bad_header_decides_the_error_as_in_uvicorn(head: Head, headers: Any) -> None:
    """With more than one thing wrong, the error raised is the one uvicorn's loop meets
    first: headers in order, each name before its value."""
    agree(head, 200, headers)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        SSE,
        [(b"Content-Type", b"text/event-stream"), (b"X-Request-ID", b"Ab-1")],  # names lowered
        [(b"content-length", b"5"), (b"content-type", b"text/plain")],
        [(b"Content-Length", b" 7 ")],
        [(b"content-length", b"5"), (b"content-length", b"9")],  # the first one counts
        [(b"transfer-encoding", b"Chunked"), (b"content-length", b"5")],  # chunked first wins
        [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")],  # chunked after too
        [(b"transfer-encoding", b"gzip")],  # not chunked: uvicorn adds its own
        [(b"connection", b"close")],
        [(b"Connection", b"Keep-Alive, CLOSE ")],
        [(b"connection", b"keep-alive")],
        [(b"x-a", b"tab\there"), (b"x-b", b"\xff\x80 high bytes")],
        [(b"x-a", b"")],
    ],
)
@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "close"])
@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("status", [200, 204, 304, 404, 299])
def test_framing_and_keep_alive_are_decided_as_uvicorn_decides_them(
    head: Head, headers: Any, keep_alive: bool, method: str, status: int
) -> None:
    """Content-Length, chunked, neither (HEAD, 204 and 304 have no body), `connection:
    close` from the app or added for a connection not kept alive, a status without a
    phrase: the same head and the same framing state."""
    agree(head, status, headers, keep_alive=keep_alive, method=method)


@pytest.mark.parametrize(
    "headers",
    [
        [[b"content-type", b"text/plain"], [b"x-a", b"1"]],  # lists, not tuples
        ((b"x-a", b"1"),),  # a tuple of headers
        [(bytearray(b"X-A"), bytearray(b"1"))],
        [(b"x-a", memoryview(b"1"))],
        [(b"content-length", memoryview(b"1"))],
        [("x-a", b"1")],  # str name
        [(b"x-a", "1")],  # str value
        [(b"x-a", b"1", b"extra")],
        [(b"x-a", b"1"), (b"x-b", b"2", b"extra")],
        [(b"x-a",)],
        [b"ab"],
    ],
    ids=repr,
)
def test_headers_of_an_unusual_shape_get_what_uvicorn_gives_them(head: Head, headers: Any) -> None:
    """Lists for pairs, bytes-likes, str, items of the wrong length: written as uvicorn
    writes them, or refused with uvicorn's error."""
    agree(head, 200, headers)


@pytest.mark.parametrize("status", [99, 600, "200", None])
def test_a_status_uvicorn_has_no_line_for_is_refused_alike(head: Head, status: Any) -> None:
    """A status outside 100..599, or not an int: uvicorn's `KeyError`."""
    agree(head, status, SSE)


_NAMES = st.sampled_from(
    [b"content-type", b"Content-Length", b"content-length", b"Transfer-Encoding", b"connection"]
    + [b"CONNECTION", b"x-a", b"X-Request-Id", b"", b"bad name", b"x(y)", b"caf\xc3\xa9"]
)
_VALUES = st.sampled_from(
    [b"chunked", b"CHUNKED", b"gzip, chunked", b"5", b" 12 ", b"1_0", b"-3", b"abc", b""]
    + [b"close", b"keep-alive, Close", b"\tclose\t", b"closed", b"text/event-stream"]
    + [b"\xff", b"\xc3\xa9", b"a\rb", b"a\x00"]
) | st.binary(max_size=8)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from([200, 204, 304, 404, 299, 500]),
    st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
    st.booleans(),
    st.sampled_from(["POST", "HEAD"]),
)
def test_any_head_of_these_names_and_values_is_uvicorns(
    status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool, method: str
) -> None:
    """Framing names in any order and casing, repeated, with values good, odd (numbers
    `int()` takes or refuses, non-UTF-8 bytes) and bad (control bytes): both twins give
    uvicorn's head, framing and keep-alive, or its error."""
    theirs = uvicorns(status, headers, keep_alive=keep_alive, method=method)
    compiled = importlib.import_module("sidecar._heads").response_head
    for head in (head_rules.response_head, compiled):
        assert ours(head, status, headers, keep_alive=keep_alive, method=method) == theirs
