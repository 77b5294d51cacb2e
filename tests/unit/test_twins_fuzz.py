"""The compiled core against untrusted and hostile input: each finding of the C review as a
named reproducer, and a differential fuzz of the request-side twins over the bytes a client
or an upstream can send (huge lines, invalid UTF-8, every byte, every split across reads).

`make sanitize` runs this file, with the twin tests, against extensions built with
AddressSanitizer and UBSan (`tests/support/sanitize.py`); `make test` runs it as it is, where
a reproducer still fails on what the C does (a crash, a write before an error) even where no
sanitizer would see the over-read itself.
"""

from __future__ import annotations

import asyncio
import os
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middleware import relaycore
from middleware.phases import Phase
from middleware.sse import LineState
from sidecar import head_rules
from sidecar.upstream import h1core
from tests.support.compiled import built
from tests.support.fuzzing import examples

compiled_relay = built("middleware._relaycore")
compiled_otlp = built("middleware.telemetry._otlp")
compiled_heads = built("sidecar._heads")
compiled_sidecar = built("sidecar._core")
compiled_uvread = built("sidecar._uvread")
TWINS = ["python", "compiled"]


def need(module: Any) -> Any:
    if module is None:
        pytest.fail("the compiled core is not built: `make install` builds it (needs gcc)")
    return module


def test_a_sanitized_run_imports_the_sanitized_build() -> None:
    """Under `make sanitize` every compiled module comes from the sanitized copy of the tree
    (the working directory), not from the working tree's own build: else the sanitizers
    would watch nothing."""
    sanitized = os.environ.get("SIDESTREAM_SANITIZED")
    modules = [compiled_relay, compiled_otlp, compiled_heads, compiled_sidecar]
    if sanitized is None:  # a plain run: the build under test is this tree's
        assert all(module is not None for module in modules)
        return
    for module in map(need, modules):
        assert module.__name__ in sanitized.split()
        assert os.path.realpath(module.__file__).startswith(os.path.realpath(os.getcwd()))


# -- the review's findings, one test each -------------------------------------------------


def test_otlp_a_cached_encoding_that_is_not_bytes_is_read_as_python_reads_it() -> None:
    """The hand C loop once read a cache's value as bytes without asking: a bytearray there
    was copied by its bytes' length from the wrong place (a heap over-read into the exported
    span). The compiled loop joins a bytes-like value as the Python one does, from a hit and
    from an encoder method, and refuses anything else with the same TypeError."""
    from middleware.telemetry import otlp_attributes

    items = [("k", "v")]
    for loop in (need(compiled_otlp).attributes, otlp_attributes.attributes):
        cache = {("k", "v"): bytearray(b"x" * 64)}
        assert loop(items, cache, {}, {}, None, None, {}, b"\x4a") == b"x" * 64
        miss = lambda *a: bytearray(b"y")  # noqa: E731
        assert loop(items, {}, {}, {}, miss, None, {}, b"\x4a") == b"y"
        with pytest.raises(TypeError):
            loop(items, {("k", "v"): "x"}, {}, {}, None, None, {}, b"\x4a")
        with pytest.raises(TypeError):  # a miss whose encoding is not bytes either
            loop(items, {}, {}, {}, lambda *a: 1, None, {}, b"\x4a")


def test_otlp_nothing_to_encode_copies_nothing() -> None:
    """No attribute, or an empty encoding: nothing is copied (`memcpy` from NULL once was),
    and the answer is empty bytes, as the Python loop's `b"".join([])`."""
    attributes = need(compiled_otlp).attributes
    assert attributes([], {}, {}, {}, None, None, {}, b"\x4a") == b""
    assert attributes([("k", "v")], {("k", "v"): b""}, {}, {}, None, None, {}, b"\x4a") == b""


def relay(twin: str, written: list[bytes]) -> Any:
    """A RelayCore of `twin` in BODY, writing into `written`."""
    base = relaycore.RelayCore if twin == "python" else need(compiled_relay).RelayCore

    class Relay(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def _scan(self, body: bytes, now: float) -> None:
            pass

    r = Relay()
    times: list[float] = []
    r.tally = (relaycore.Tally if twin == "python" else need(compiled_relay).Tally)(
        times, 3, times.clear
    )
    r.phase = Phase.BODY
    r.reason = r.sending_since = r.keepalive = r.inflater = r.edit = r.scanner = None
    r.first_token_at = None
    r.slice_bytes = 0
    r.line_state = LineState.EVENT
    r.last_chunk = r.last_write = 0.0
    r.server_nowait = lambda body: written.append(body) or True
    return r


class FalseRaises:
    ends = None

    def __call__(self, body: bytes) -> Any:
        return self

    def __bool__(self) -> bool:
        raise ValueError("no truth")

    def undo(self) -> None:
        pass


@pytest.mark.parametrize("twin", TWINS)
def test_an_edit_whose_answer_has_no_truth_writes_nothing(twin: str) -> None:
    """The edit's answer is asked `if out`: when that raises, the error is the caller's and
    nothing was written (`_relaycore.c` wrote first, then raised SystemError)."""
    written: list[bytes] = []
    r = relay(twin, written)
    r.edit = FalseRaises()
    with pytest.raises(ValueError, match="no truth"):
        r.send_nowait(b"data: x\n\n")
    assert written == []


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "field, accounted", [("tally", True), ("server_nowait", False), ("line_state", True)]
)
def test_a_deleted_field_is_an_attribute_error_not_a_crash(
    twin: str, field: str, accounted: bool
) -> None:
    """`del relay.tally` (or another field the token path reads) makes the next write, and
    the accounting where it reads that field, raise AttributeError as the Python twin's empty
    slot does; the compiled one read NULL and crashed."""
    r = relay(twin, [])
    delattr(r, field)
    with pytest.raises(AttributeError):
        r.send_nowait(b"data: x\n\n")
    if accounted:
        with pytest.raises(AttributeError):
            r._account(b"data: x\n\n", 1.0)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("field", ["frame", "times", "fold"])
def test_a_deleted_tally_field_is_an_attribute_error_on_the_token_path(
    twin: str, field: str
) -> None:
    """A token chunk of the tally's frame is tallied into its `times`, folded by its `fold`
    (every 3 here): any of the three deleted, that is an AttributeError from both twins, not
    a read of NULL."""
    from middleware import frame as frame_module

    r = relay(twin, [])
    prefix, marker = b'data: {"c":"', b'"}'
    r.tally.frame = frame_module.Frame(prefix, marker, marker + b"\n\n")
    body = prefix + b"x" + marker + b"\n\n"
    r._account(body, 1.0)
    r._account(body, 2.0)
    delattr(r.tally, field)
    with pytest.raises(AttributeError):
        r._account(body, 3.0)


def test_quiet_takes_only_uvloops_own_transport() -> None:
    """`_uvread.quiet` read any object big enough as uvloop's transport, following a pointer
    out of it: an object of any other type is now turned down before anything is read, a
    Python class named as uvloop's type included."""
    uvread = need(compiled_uvread)

    class TCPTransport:  # a heap type: its name is not the static type's
        __slots__ = tuple(f"f{i}" for i in range(16))

    TCPTransport.__name__ = "uvloop.loop.TCPTransport"
    fake = TCPTransport()
    for i in range(16):
        setattr(fake, f"f{i}", 0xDEAD)
    loop = asyncio.new_event_loop()
    try:
        assert uvread.quiet(fake, loop, object()) is False
        assert uvread.quiet(b"x" * 256, loop, object()) is False
        assert uvread.quieted(fake) == (False, False)
    finally:
        loop.close()


# -- differential fuzz: what a client or an upstream controls -----------------------------

# Bytes as they come off the wire: every byte value, invalid UTF-8, long runs.
_wire = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\x00", b"\r\n", b"\x7f", b"\t"]),
    st.integers(1, 70_000).map(lambda n: b"a" * n),
)
_names = st.one_of(
    st.sampled_from(
        [b"Host", b"content-length", b"Transfer-Encoding", b"Connection", b"x-forwarded-for",
         b"TE", b"cookie", b"authorization"]
    ),
    _wire,
)  # fmt: skip
_headers = st.lists(st.tuples(_names, _wire), max_size=6)


@settings(max_examples=examples(150), deadline=None)
@given(_headers, st.sampled_from(["1.0", "1.1", "2", "0.9", "\u00e9"]), st.none() | st.text())
def test_request_rules_agree_on_any_bytes(
    headers: list[tuple[bytes, bytes]], version: str, client: str | None
) -> None:
    """The compiled request rules give the Python ones' answer (or their error) for headers of
    any bytes and length, any version and any client address."""
    compiled = need(compiled_heads).request_rules
    args = (headers, version, b"up:1", client, "http")

    def outcome(rule: Any) -> Any:
        try:
            return rule(*args)
        except Exception as exc:
            return type(exc)

    assert outcome(compiled) == outcome(head_rules.request_rules)


@settings(max_examples=examples(150), deadline=None)
@given(_headers)
def test_response_and_read_headers_agree_on_any_bytes(headers: list[tuple[bytes, bytes]]) -> None:
    """The upstream's response headers and a client's request headers, read by each twin:
    the same headers, in the same order, whatever bytes and lengths they hold."""
    heads = need(compiled_heads)
    assert heads.response_headers(headers) == head_rules.response_headers(headers)
    if headers:  # a request has at least one header (Host) by the time they are read
        compiled, python = list(headers), list(headers)  # both read in place
        assert (heads.read_headers(compiled), compiled) == (
            head_rules.read_headers(python),
            python,
        )


def _response(payloads: list[bytes]) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in payloads)
    return head + body + b"0\r\n\r\n"


def _read(twin: str, reads: list[bytes]) -> tuple[list[Any], bytes, bool]:
    """Feed `reads` to an H1Core of `twin` on httptools: (events, body, complete)."""
    import httptools

    base = h1core.H1Core if twin == "python" else need(compiled_sidecar).H1Core

    class Conn(base):  # type: ignore[misc, valid-type]
        __slots__ = ("events",)

        def abort(self) -> None:
            self.events.append("abort")

        def _feed_failed(self, exc: Exception) -> None:
            self.events.append(type(exc).__name__)

        def _after_feed(self) -> None:
            self.events.append(("fed", len(self.chunks)))

        def _refuse_head(self) -> None:
            raise ValueError("head too long")

    c = Conn()
    c.events, c.headers, c.chunks, c.sink, c._head_bytes = [], [], [], None, 0
    c.complete = c.received = c.at_boundary = c.chunk_end = False

    class Protocol:
        def on_header(self, name: bytes, value: bytes) -> None:
            c.on_header(name, value)

        def on_headers_complete(self) -> None:
            c.chunk_end = True

        def on_body(self, piece: bytes) -> None:
            c.chunks.append(piece)

        def on_chunk_header(self) -> None:
            c.on_chunk_header()

        def on_chunk_complete(self) -> None:
            c.on_chunk_complete()

        def on_message_complete(self) -> None:
            c.complete = True

    c._parser = httptools.HttpResponseParser(Protocol())
    for data in reads:
        try:
            c.data_received(data)
        except ValueError as exc:
            c.events.append(str(exc))
            break
    return c.events, b"".join(c.chunks), c.complete


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(_wire, max_size=6),
    st.lists(st.integers(0, 1 << 20), max_size=16),
    st.binary(max_size=32),
)
def test_an_upstream_response_cut_anywhere_reads_alike(
    payloads: list[bytes], cuts: list[int], noise: bytes
) -> None:
    """A chunked SSE response with payloads of any bytes and length (and noise after it),
    cut into reads at any points: both twins hand on the same body, see the same events and
    end the same way."""
    wire = _response(payloads) + noise
    points = sorted({0, len(wire), *(cut % (len(wire) + 1) for cut in cuts)})
    reads = [wire[a:b] for a, b in pairwise(points)]
    assert _read("compiled", reads) == _read("python", reads)
