"""Unit tests for the proxy's header and request-target rules (pure functions)."""

from __future__ import annotations

import pytest

from sidecar import headers as rules


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
    headers and Content-Length kept, hop-by-hop dropped."""
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
        (b"content-length", b"5"),
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
