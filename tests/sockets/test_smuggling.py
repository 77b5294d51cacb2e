"""Request framing against an upstream that would show a smuggled request.

The upstream here (`tests.support.recorder.ByteRecorder`) accepts anything, answers every
request it finds by Content-Length alone, and records every byte; what it received is then
read by h11, the strict parser. The rule checked throughout: one client request becomes at
most one upstream request, and that request carries exactly one framing header matching
its body (none when it has no body), never Content-Length and Transfer-Encoding together.
Both listeners: the sidecar's own uvicorn protocol (HTTP/1.1) and hypercorn (`--http2`,
HTTP/1.1 through h11 and h2c).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.servers.http1 import protocol_class
from sidecar.servers.uvicorn_listener import HEAD_SLACK_BYTES
from tests.support.recorder import ByteRecorder, Received
from tests.support.servers import serve

LISTENERS = ("sidecar-h1", "hypercorn")
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: client.example\r\n"
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


def _app(port: int) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{port}", "--usage", "pass"], environ={})
    return build_guard(settings, StreamRegistry())


def _options(listener: str) -> dict[str, Any]:
    if listener == "hypercorn":
        return {"server": "hypercorn"}
    return {"http": protocol_class(10.0, 32768 + HEAD_SLACK_BYTES)}


async def _exchange(port: int, raw: bytes, timeout: float = 5.0) -> int | None:
    """Send `raw` on a new connection, read until the server closes; the first status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)
    except ConnectionError:
        data = b""
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


class Rig:
    """A recorder upstream and the sidecar in front of it, on one listener."""

    def __init__(self, recorder: ByteRecorder, port: int) -> None:
        self.recorder = recorder
        self.port = port

    def requests(self) -> list[Received]:
        return self.recorder.requests()


async def _rig(listener: str) -> AsyncIterator[Rig]:
    recorder = ByteRecorder()
    async with recorder.running(), serve(_app(recorder.port), **_options(listener)) as port:
        yield Rig(recorder, port)


@pytest.fixture(params=LISTENERS)
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    async for made in _rig(request.param):
        yield made


def assert_framed(request: Received) -> None:
    """The framing invariant of one upstream request."""
    lengths, encodings = request.count(b"content-length"), request.count(b"transfer-encoding")
    assert lengths + encodings <= 1, request.headers
    if request.body:
        assert lengths + encodings == 1, request.headers
    if lengths:
        value = next(v for n, v in request.headers if n.lower() == b"content-length")
        assert int(value) == len(request.body)


REFUSED = {
    "Connection names Content-Length": HEAD
    + b"Connection: content-length\r\nContent-Length: 35\r\n\r\n"
    + SMUGGLED,
    "Connection names it among others": HEAD
    + b"Connection: keep-alive, Content-Length\r\nContent-Length: 35\r\n\r\n"
    + SMUGGLED,
    "Connection names Transfer-Encoding": HEAD
    + b"Connection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"23\r\n"
    + SMUGGLED
    + b"\r\n0\r\n\r\n",
    "Connection names Host": HEAD + b"Connection: host\r\nContent-Length: 0\r\n\r\n",
    "Content-Length of 20 digits past its zeros": HEAD
    + b"Content-Length: 00012345678901234567890\r\n\r\nabcde",
}


@pytest.mark.parametrize("raw", list(REFUSED.values()), ids=list(REFUSED))
async def test_framing_a_connection_header_or_a_long_length_could_undo_is_refused(
    rig: Rig, raw: bytes
) -> None:
    """A `Connection` that lists a framing header (its removal as hop-by-hop would forward
    the body unframed, read upstream as the next request), and a Content-Length past 19
    digits (Python's int() refuses past 4,300, where httptools reads 5), get a refusal and
    nothing reaches the upstream: not the request, not the request inside its body."""
    status = await _exchange(rig.port, raw)
    assert status in (400, None), status  # hypercorn's h11 may close without a word
    assert rig.requests() == []
    assert rig.recorder.answered == 0


async def test_connection_may_still_name_te(rig: Rig) -> None:
    """RFC 9110 asks a client that sends TE to list it in Connection: that request is
    served, as one request, without TE (hop-by-hop) and with its body framed."""
    raw = HEAD + b"TE: trailers\r\nConnection: TE, close\r\nContent-Length: 2\r\n\r\nhi"
    assert await _exchange(rig.port, raw) == 200
    [request] = rig.requests()
    assert request.count(b"te") == 0 and request.body == b"hi"
    assert_framed(request)


async def test_a_length_of_4301_digits_whose_value_is_5_is_5(rig: Rig) -> None:
    """Leading zeros do not count toward the 19 digits: `000…05`, 4,301 digits inside the
    header limit, is 5, as httptools reads it. The upstream gets one request framed by that
    Content-Length alone with its 5 bytes, never `transfer-encoding: chunked` beside it (the
    length once became unknown past int()'s 4,300 digits, and chunked was added)."""
    length = b"0" * 4300 + b"5"
    raw = HEAD + b"Content-Length: " + length + b"\r\nConnection: close\r\n\r\nabcde"
    status = await _exchange(rig.port, raw)
    if status == 200:
        [request] = rig.requests()
        assert request.body == b"abcde"
        assert_framed(request)
    else:  # a listener whose own parser refuses it: then nothing went upstream
        assert status == 400 and rig.requests() == []


async def test_the_early_413_reads_a_zero_padded_length() -> None:
    """The body limit is checked against the declared length before any byte is read, for a
    zero-padded length too (it was skipped once the length became unknown)."""
    recorder = ByteRecorder()
    length = b"0" * 4300 + b"2000"
    # not a chat path: the proxy's own check, before forced usage would read a chat body
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
    raw = head + b"Content-Length: " + length + b"\r\n\r\n" + b"x" * 10
    async with recorder.running():
        settings = load(
            ["--upstream", f"http://127.0.0.1:{recorder.port}", "--max-body", "1000"], environ={}
        )
        app = build_guard(settings, StreamRegistry())
        async with serve(app, **_options("sidecar-h1")) as port:
            assert await _exchange(port, raw) == 413
    assert recorder.streams == []


def _h2_request(port: int, pseudo: list[tuple[bytes, bytes]], extra: list[tuple[bytes, bytes]]):  # type: ignore[no-untyped-def]
    """One raw h2c request with no client-side header validation; the response status."""

    async def run() -> int | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False
        )
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        conn.send_headers(1, pseudo + extra, end_stream=True)
        writer.write(conn.data_to_send())
        status: int | None = None
        try:
            while status is None and (data := await asyncio.wait_for(reader.read(65536), 5)):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = int(dict(event.headers)[b":status"])
                    elif isinstance(event, h2.events.StreamReset):
                        return None
                writer.write(conn.data_to_send())
        finally:
            writer.close()
        return status

    return run()


def _pseudo(method: bytes = b"GET", path: bytes = b"/v1/models") -> list[tuple[bytes, bytes]]:
    return [(b":method", method), (b":scheme", b"http"), (b":authority", b"x"), (b":path", path)]


H2_HOSTILE = {
    "a version inside :path": (_pseudo(path=b"/a HTTP/1.0"), []),
    "a space inside :method": (_pseudo(method=b"GET /x HTTP/1.1\r\nHost: y\r\n\r\nGET"), []),
    "HTAB inside :path": (_pseudo(path=b"/a\tb"), []),
    "DEL inside :path": (_pseudo(path=b"/a\x7fb"), []),
    "a control byte inside :path": (_pseudo(path=b"/a\x01b"), []),
    "a control byte in a header value": (_pseudo(), [(b"x-a", b"a\x01b")]),
    "DEL in a header value": (_pseudo(), [(b"x-a", b"a\x7fb")]),
}


@pytest.mark.parametrize("case", list(H2_HOSTILE.values()), ids=list(H2_HOSTILE))
async def test_http2_tokens_are_checked_on_the_way_to_http1(case: Any) -> None:
    """An HTTP/2 request whose `:method`, `:path` or header values an HTTP/1.1 request line
    or header cannot carry (a method not a token; a target with SP or a control byte; a
    control byte other than HTAB in a value) gets 400, or h2 resets it itself: it never
    reaches the HTTP/1.1 upstream, as one request or as two."""
    pseudo, extra = case
    async for made in _rig("hypercorn"):
        status = await _h2_request(made.port, pseudo, extra)
        assert status in (400, None), status
        assert made.requests() == [] and made.recorder.answered == 0


# The property: random request heads over both listeners.

_TOKENS = st.sampled_from(
    [b"close", b"keep-alive", b"content-length", b"Content-Length", b"transfer-encoding",
     b"host", b"te", b"x-a", b"upgrade", b"x-forwarded-for", b""]
)  # fmt: skip
_TRAILERS = st.lists(
    st.sampled_from(
        [(b"Authorization", b"Bearer stolen"), (b"X-Forwarded-For", b"6.6.6.6"),
         (b"X-User-Id", b"admin"), (b"Content-Length", b"99"), (b"X-A", b"t")]
    ),
    max_size=3,
)  # fmt: skip
_FRAMING = st.sampled_from(["none", "length", "padded", "chunked", "both", "te-then-length"])
_BODY = st.one_of(st.binary(max_size=48), st.just(SMUGGLED), st.just(b"0\r\n\r\n" + SMUGGLED))


def _encode(framing: str, body: bytes, trailers: list[tuple[bytes, bytes]]) -> bytes:
    """Headers and body bytes for `framing`: lengths always match the bytes sent."""
    chunked = (b"%x\r\n%b\r\n" % (len(body), body) if body else b"") + b"0\r\n"
    chunked += b"".join(n + b": " + v + b"\r\n" for n, v in trailers) + b"\r\n"
    if framing == "none":
        return b"\r\n"
    if framing == "length":
        return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    if framing == "padded":
        return b"Content-Length: %s%d\r\n\r\n%b" % (b"0" * 300, len(body), body)
    if framing == "chunked":
        return b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    if framing == "both":
        return b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%b" % (
            len(chunked),
            chunked,
        )
    return b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n%b" % (len(chunked), chunked)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@example(  # each finding of the issue, tried on every run before the random heads
    listener="sidecar-h1",
    tokens=[b"content-length"],
    framing="length",
    body=SMUGGLED,
    trailers=[],
)
@example(
    listener="sidecar-h1",
    tokens=[],
    framing="chunked",
    body=b'{"a":1}',
    trailers=[(b"Authorization", b"Bearer stolen"), (b"X-Forwarded-For", b"6.6.6.6")],
)
@given(
    listener=st.sampled_from(LISTENERS),
    tokens=st.lists(_TOKENS, max_size=4),
    framing=_FRAMING,
    body=_BODY,
    trailers=_TRAILERS,
)
async def test_any_request_head_makes_at_most_one_well_framed_upstream_request(
    listener: str,
    tokens: list[bytes],
    framing: str,
    body: bytes,
    trailers: list[tuple[bytes, bytes]],
) -> None:
    """Whatever `Connection` lists, whatever framing headers, trailers and body a client
    sends: the upstream receives at most one request, h11 reads it without error, it is
    framed by exactly one header matching its body (or none, with no body), no trailer
    field reached it as a header, and a 200 means the body arrived whole."""
    connection = b"Connection: " + b", ".join(tokens) + b"\r\n" if tokens else b""
    raw = HEAD + connection + b"Connection: close\r\n" + _encode(framing, body, trailers)
    async for made in _rig(listener):
        status = await _exchange(made.port, raw)
        requests = made.requests()
        assert len(requests) <= 1, requests
        for request in requests:
            assert_framed(request)
            sent = {n.lower() for n, _ in request.headers}
            assert b"authorization" not in sent and b"x-user-id" not in sent
            assert b"6.6.6.6" not in b"".join(v for _, v in request.headers)
        if status == 200:  # with no framing header the bytes after the head are no body
            assert len(requests) == 1 and requests[0].body == (b"" if framing == "none" else body)
