"""Unit tests for the proxy's header and request-target rules (pure functions)."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import head_rules
from sidecar import headers as rules
from tests.support.fuzzing import examples


def test_connection_tokens_are_parsed_from_every_connection_header() -> None:
    """Connection lists header names, comma-separated, any case, across repeated headers."""
    tokens = rules.connection_tokens(
        [(b"Connection", b"keep-alive, X-Foo ,,"), (b"connection", b"X-BAR"), (b"x-foo", b"1")]
    )
    assert tokens == {b"keep-alive", b"x-foo", b"x-bar"}


def test_every_hop_by_hop_header_is_stripped_and_names_lowercased() -> None:
    """All nine RFC hop-by-hop headers go; others stay, lower-cased, in order."""
    hop = [
        (b"Connection", b"close"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Proxy-Authenticate", b"Basic"),
        (b"Proxy-Authorization", b"Basic eA=="),
        (b"Proxy-Connection", b"keep-alive"),
        (b"TE", b"trailers"),
        (b"Trailer", b"X-T"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"websocket"),
    ]
    kept = [(b"Content-Type", b"text/event-stream"), (b"X-A", b"1"), (b"x-a", b"2")]
    assert rules.strip_hop_by_hop(hop[:3] + kept + hop[3:]) == [
        (b"content-type", b"text/event-stream"),
        (b"x-a", b"1"),
        (b"x-a", b"2"),
    ]


def test_headers_named_in_connection_are_stripped() -> None:
    """A header named in Connection is hop-by-hop for this message."""
    stripped = rules.strip_hop_by_hop(
        [(b"connection", b"X-Secret, Cookie"), (b"x-secret", b"s"), (b"cookie", b"c"), (b"a", b"1")]
    )
    assert stripped == [(b"a", b"1")]


@pytest.mark.parametrize(
    ("existing", "client", "expected"),
    [
        ([], "10.0.0.9", b"10.0.0.9"),
        ([b"1.1.1.1"], "10.0.0.9", b"1.1.1.1, 10.0.0.9"),
        ([b"1.1.1.1, 2.2.2.2", b" 3.3.3.3 "], "::1", b"1.1.1.1, 2.2.2.2, 3.3.3.3, ::1"),
        ([b"1.1.1.1"], None, b"1.1.1.1"),
        ([], None, None),
        ([b"  "], None, None),
    ],
)
def test_forwarded_for_appends_the_peer(
    existing: list[bytes], client: str | None, expected: bytes | None
) -> None:
    """X-Forwarded-For keeps prior hops in order and appends the peer's address."""
    assert rules.forwarded_for(existing, client) == expected


def test_request_headers_set_host_identity_and_forwarded_headers() -> None:
    """Upstream request headers: Host is the upstream's, Accept-Encoding identity,
    X-Forwarded-For/-Proto/-Host added (client values replaced or appended), end-to-end
    headers kept, hop-by-hop dropped, and both framing headers left to the proxy, which
    writes the one that frames the body it sends."""
    out = rules.request_headers(
        [
            (b"host", b"api.example.com"),
            (b"accept-encoding", b"gzip"),
            (b"x-forwarded-for", b"1.1.1.1"),
            (b"x-forwarded-proto", b"http"),
            (b"x-forwarded-host", b"spoofed"),
            (b"content-length", b"5"),
            (b"transfer-encoding", b"chunked"),
            (b"authorization", b"Bearer k"),
        ],
        authority=b"127.0.0.1:8000",
        client="10.1.2.3",
        scheme="https",
    )
    assert out == [
        (b"host", b"127.0.0.1:8000"),
        (b"authorization", b"Bearer k"),
        (b"accept-encoding", b"identity"),
        (b"x-forwarded-for", b"1.1.1.1, 10.1.2.3"),
        (b"x-forwarded-proto", b"https"),
        (b"x-forwarded-host", b"api.example.com"),
    ]


def test_request_headers_without_host_or_client() -> None:
    """No client Host → no X-Forwarded-Host; no peer and no prior XFF → no X-Forwarded-For."""
    out = rules.request_headers([], authority=b"localhost", client=None, scheme="http")
    assert out == [
        (b"host", b"localhost"),
        (b"accept-encoding", b"identity"),
        (b"x-forwarded-proto", b"http"),
    ]


def test_response_headers_keep_content_length_and_drop_hop_by_hop() -> None:
    """Response headers keep Content-Length (byte-identical relay) and drop hop-by-hop."""
    out = rules.response_headers(
        [(b"Content-Length", b"2"), (b"Connection", b"close, X-H"), (b"X-H", b"1"), (b"ETag", b"e")]
    )
    assert out == [(b"content-length", b"2"), (b"etag", b"e")]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"transfer-encoding", b"chunked")], True),
        ([(b"Transfer-Encoding", b"gzip, Chunked")], True),
        ([(b"transfer-encoding", b"chunked, gzip")], False),
        ([(b"content-length", b"3")], False),
        ([], False),
    ],
)
def test_chunked_means_chunked_is_the_final_coding(
    headers: list[tuple[bytes, bytes]], expected: bool
) -> None:
    """A body is chunked-framed only when chunked is the last transfer coding."""
    assert rules.chunked(headers) is expected


def test_content_length_and_header_bytes() -> None:
    """Content-Length parses (None when absent or invalid); header size counts the wire form."""
    assert rules.content_length([(b"Content-Length", b"42")]) == 42
    assert rules.content_length([(b"content-length", b"4x")]) is None
    assert rules.content_length([]) is None
    assert rules.header_bytes([(b"ab", b"cde"), (b"f", b"")]) == (2 + 3 + 4) + (1 + 0 + 4)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"/v1/chat?x=1", b"/v1/chat?x=1"),
        (b"*", b"*"),
        (b"http://evil.example/steal?q=1", b"/steal?q=1"),
        (b"http://evil.example:8080", b"/"),
        (b"http://evil.example?q=1", b"/?q=1"),
        (b"https://u@evil.example/a/b", b"/a/b"),
        (b"evil", b"/evil"),
        (b"//evil.example/x", b"//evil.example/x"),
    ],
)
def test_origin_form_never_keeps_an_authority(target: bytes, expected: bytes) -> None:
    """Absolute-form targets are reduced to path and query; origin-form is unchanged."""
    assert rules.origin_form(target) == expected


# The rules above, read one header at a time: the plain statement of each rule, which the
# module's C-level passes over all headers at once must agree with on any header list.


def _plain_strip(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    drop = set(rules.HOP_BY_HOP)
    for name, value in headers:
        if name.lower() == b"connection":
            drop |= {t.strip().lower() for t in value.split(b",") if t.strip()}
    return [(name.lower(), value) for name, value in headers if name.lower() not in drop]


def _plain_codings(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [
        coding.strip().lower()
        for name, value in headers
        if name.lower() == b"transfer-encoding"
        for coding in value.split(b",")
    ]


def _plain_length(value: bytes) -> int | None:
    """Content-Length's rule, digit by digit: ASCII digits, at most 19 past leading zeros."""
    digits = value.strip()
    if not digits or any(c not in b"0123456789" for c in digits):
        return None
    significant = digits[next((i for i, c in enumerate(digits) if c != 0x30), len(digits)) :]
    return None if len(significant) > 19 else int(significant or b"0")


def _plain_problem(headers: list[tuple[bytes, bytes]], version: str) -> str | None:
    if version not in ("1.0", "1.1", "2"):
        return "version"
    lengths, hosts, listed = [], 0, set()
    for name, value in headers:
        controls = [c for c in value if (c < 0x20 and c != 0x09) or c == 0x7F]
        if controls or any(c < 0x21 or c == 0x7F or chr(c) in '()<>@,;:[]={}\\"' for c in name):
            return "a header contains a control character"
        if name.lower() == b"content-length":
            lengths.append(value.strip())
        if name.lower() == b"connection":
            listed |= {token.strip().lower() for token in value.split(b",")}
        hosts += name.lower() == b"host"
    if listed & {b"content-length", b"transfer-encoding", b"host"}:
        return "Connection names Content-Length, Transfer-Encoding or Host"
    codings = _plain_codings(headers)
    if lengths and codings:
        return "both Content-Length and Transfer-Encoding"
    if len(lengths) > 1:
        return "more than one Content-Length"
    if lengths and _plain_length(lengths[0]) is None:
        return "Content-Length is not a number of at most 19 digits"
    if codings and codings[-1] != b"chunked":
        return "Transfer-Encoding does not end in chunked"
    if hosts > 1 or (hosts == 0 and version == "1.1"):
        return "an HTTP/1.1 request needs exactly one Host"
    return None


def _plain_request(
    headers: list[tuple[bytes, bytes]], client: str | None
) -> list[tuple[bytes, bytes]]:
    replaced = {b"host", b"accept-encoding", b"content-length", b"x-forwarded-for"}
    replaced |= {b"x-forwarded-proto", b"x-forwarded-host"}
    out, prior, host = [(b"host", b"up:1")], [], None
    for name, value in _plain_strip(headers):
        if name not in replaced:
            out.append((name, value))
        elif name == b"x-forwarded-for":
            prior.append(value)
        elif name == b"host" and host is None:
            host = value
    out.append((b"accept-encoding", b"identity"))
    xff = rules.forwarded_for(prior, client)
    out += [(b"x-forwarded-for", xff)] if xff is not None else []
    out.append((b"x-forwarded-proto", b"http"))
    return out + ([(b"x-forwarded-host", host)] if host is not None else [])


_NAMES = [
    b"Host", b"host", b"Content-Length", b"content-length", b"Transfer-Encoding",
    b"Connection", b"connection", b"X-Forwarded-For", b"x-forwarded-host", b"TE",
    b"keep-alive", b"x-a", b"X-A", b"accept-encoding", b"authorization",
    # near misses of names dropped (same length, or one byte short): told apart by bytes
    b"tf", b"hosx", b"Trailer", b"upgradd", b"x-forwarded-prot", b"keep-aliv",
    b"x y", b"x:y", b"x\x01",
]  # fmt: skip
_VALUES = [
    b"", b"5", b" 12 ", b"4x", b"chunked", b"gzip, chunked", b"chunked, gzip", b"x-a",
    b"close, X-Forwarded-For", b"Host", b"1.1.1.1", b"a\rb", b"a\nb", b"a\x00b",
    b"a\tb", b"a\x7fb", b"a\x01b", b"keep-alive, Content-Length", b"TE, close",
    b"transfer-encoding", b"0" * 4301 + b"5", b"0" * 30 + b"9" * 19, b"1" + b"0" * 19,
    b"\xd9\xa3", b"\xef\xbc\x93",
]  # fmt: skip
_HEADER = st.tuples(st.sampled_from(_NAMES), st.sampled_from(_VALUES))


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_HEADER, max_size=8), st.sampled_from(["1.0", "1.1", "2", "0.9"]), st.booleans())
def test_rules_agree_with_a_header_at_a_time(
    headers: list[tuple[bytes, bytes]], version: str, shared: bool
) -> None:
    """Every rule, computed over all headers at once, is the plain per-header reading of it:
    the same refusal, hop-by-hop set, framing and upstream headers for any header list,
    whether each rule lower-cases the names itself or is handed them (`shared`: the proxy
    makes them once per request)."""
    names = rules.lower_names(headers) if shared else None
    problem = rules.request_problem(headers, version, names)
    if version == "0.9":
        assert problem is not None and problem.startswith("HTTP version")
    else:
        assert problem == _plain_problem(headers, version)
    assert rules.strip_hop_by_hop(headers) == _plain_strip(headers)
    codings = _plain_codings(headers)
    assert rules.chunked(headers, names) == (bool(codings) and codings[-1] == b"chunked")
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    declared = _plain_length(lengths[0]) if lengths else None
    assert rules.content_length(headers, names) == declared
    assert rules.header_bytes(headers) == sum(len(n) + len(v) + 4 for n, v in headers)
    for client in ("10.0.0.1", None):
        out = rules.request_headers(
            headers, authority=b"up:1", client=client, scheme="http", names=names
        )
        assert out == _plain_request(headers, client)


# `request_rules`: all of the proxy's request rules in one call, in two twins (Python,
# `sidecar.head_rules`, and compiled: `sidecar/_heads.c`), the same answer for any header list.


def _twins(name: str = "request_rules") -> list[object]:
    try:
        compiled = getattr(importlib.import_module("sidecar._heads"), name)
    except ImportError:
        pytest.fail("the compiled twin is not built: `make install` builds it (needs gcc)")
    return [getattr(head_rules, name), compiled]


def _outcome(twin: object, *args: object) -> object:
    try:
        return twin(*args)  # type: ignore[operator]
    except Exception as exc:
        return type(exc), str(exc)


_ODD_VALUES = [b"+5", b"-3", b"1_0", b"\t7\t", b"\xff", b"close ,, te", b"chunked,", b"CHUNKED"]


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*_NAMES, b""]), st.sampled_from(_VALUES + _ODD_VALUES) | st.binary()
        ),
        max_size=8,
    ),
    st.sampled_from(["1.0", "1.1", "2", "0.9", "HTTP/2.0"]),
    st.sampled_from([None, "", "10.0.0.1", "::1"]),
    st.sampled_from(["http", "https"]),
)
def test_each_twin_of_request_rules_gives_the_rules_one_by_one(
    headers: list[tuple[bytes, bytes]], version: str, client: str | None, scheme: str
) -> None:
    """Size, refusal, Content-Length, chunked and upstream headers: what each rule gives on
    its own, from the Python twin and the compiled one alike."""
    names = rules.lower_names(headers)
    expected = (
        rules.header_bytes(headers),
        rules.request_problem(headers, version, names),
        rules.content_length(headers, names),
        rules.chunked(headers, names),
        rules.request_headers(headers, authority=b"up:1", client=client, scheme=scheme),
    )
    for twin in _twins():
        assert twin(headers, version, b"up:1", client, scheme) == expected


@pytest.mark.parametrize(
    ("headers", "version", "client"),
    [
        ([[b"host", b"a"], [b"x-a", b"1"]], "1.1", None),  # lists, not tuples
        (((b"host", b"a"),), "1.1", "10.0.0.1"),  # a tuple of headers
        ([(bytearray(b"Host"), b"a")], "1.1", None),
        ([(b"host", memoryview(b"a"))], "1.1", None),
        ([("host", b"a")], "1.1", None),  # str name
        ([(b"host", b"a", b"extra")], "1.1", None),
        ([(b"host",)], "1.1", None),
        ([b"ab"], "1.1", None),
        ([(b"host", b"a")], None, None),  # no version
        ([(b"host", b"a")], "1.1", "caf\u00e9\u20ac"),  # a peer address latin-1 cannot spell
    ],
    ids=repr,
)
def test_headers_of_an_unusual_shape_get_the_same_answer_from_both_twins(
    headers: object, version: object, client: object
) -> None:
    """What a server should never hand over (pairs as lists, bytes-likes, str, items of
    the wrong length, no version, an odd peer): the compiled twin gives the Python twin's
    answer or its error, a `TypeError` naming the header that is not a pair of bytes."""
    python, compiled = _twins()
    args = (headers, version, b"up:1", client, "http")
    assert _outcome(compiled, *args) == _outcome(python, *args)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*_NAMES, b"", b"Keep-Alive", b"UPGRADE"]),
            st.sampled_from(_VALUES + _ODD_VALUES) | st.binary(),
        ),
        max_size=8,
    )
)
def test_each_twin_of_response_headers_is_the_plain_reading(
    headers: list[tuple[bytes, bytes]],
) -> None:
    """The upstream's headers for downstream, from either twin: every name lower-cased,
    the hop-by-hop ones and those any Connection header names dropped, the rest in order."""
    for twin in _twins("response_headers"):
        assert twin(headers) == _plain_strip(headers)  # type: ignore[operator]


@pytest.mark.parametrize(
    "headers",
    [
        [[b"Content-Type", b"a"]],
        ((b"X-A", b"1"), (b"connection", b"x-a")),
        [(bytearray(b"X-A"), b"1")],
        [("x-a", b"1")],
        [(b"x-a", b"1", b"2")],
        [b"ab"],
    ],
    ids=repr,
)
def test_odd_response_headers_get_the_same_answer_from_both_twins(headers: object) -> None:
    """Pairs as lists, a tuple of pairs, bytes-likes, str, odd items: the compiled twin gives
    the Python twin's answer or its error."""
    python, compiled = _twins("response_headers")
    assert _outcome(compiled, headers) == _outcome(python, headers)


def test_no_twin_changes_the_bytes_it_is_given() -> None:
    """Bytes are immutable: a twin that lower-cases makes a new object. CPython shares one
    object per single byte (`b"XQ"[1:2] is b"YQ"[1:2]`), so lower-casing a one-byte name or
    Connection token in place would change that byte for the whole process (it did: a
    `data: [DONE]` cut before its `D` went out as `[dONE]`)."""
    heads = importlib.import_module("sidecar._heads")
    calls = [
        (head_rules.request_rules, heads.request_rules, ("1.1", b"up:1", "10.0.0.1", "http")),
        (head_rules.response_headers, heads.response_headers, ()),
        (head_rules.read_headers, heads.read_headers, ()),
    ]
    for python, compiled, rest in calls:
        for twin in (python, compiled):
            name, token = b"-Q"[1:2], b"-K"[1:2]  # the shared one-byte objects
            headers = [(name, b"1"), (b"Connection", token), (token, b"v")]
            twin(headers, *rest)
            assert (b"-Q"[1:2][0], b"-K"[1:2][0]) == (ord("Q"), ord("K")), twin
    head_twins = (head_rules.response_head, heads.response_head)
    for twin in head_twins:
        twin(200, [(b"-Q"[1:2], b"1"), (b"Connection", b"-K"[1:2])], True, False)
        assert (b"-Q"[1:2][0], b"-K"[1:2][0]) == (ord("Q"), ord("K")), twin
