"""Unit tests for the stream's header rules in `middleware.stream_response` (pure functions)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from middleware import stream_response

_NAMES = [
    b"Content-Type", b"content-type", b"Content-Encoding", b"content-length",
    b"Transfer-Encoding", b"connection", b"Cache-Control", b"X-Accel-Buffering",
    b"x-request-id", b"TE", b"upgrade",
]  # fmt: skip
_VALUES = [b"text/event-stream", b"Text/Event-Stream; charset=utf-8", b" GZIP ", b"x", b""]
_HEADER = st.tuples(st.sampled_from(_NAMES), st.sampled_from(_VALUES))


def _plain_media_type(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    kind = encoding = b""
    for name, value in headers:
        if name.lower() == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
        elif name.lower() == b"content-encoding":
            encoding = value.strip().lower()
    return kind, encoding


@settings(max_examples=300, deadline=None)
@given(st.lists(_HEADER, max_size=8), st.booleans())
def test_stream_header_rules_read_each_header_in_turn(
    headers: list[tuple[bytes, bytes]], decode: bool
) -> None:
    """The media type and encoding are the last such headers' (lower-cased, parameters off);
    a stream's headers are the app's in order, without framing, hop-by-hop and the two the
    guard sets (and Content-Encoding when it decodes), then the guard's two: Cache-Control the
    app's directives with no-transform added (no-cache, no-transform where it gave none).
    Both read the names `guarded` reads once and hands on."""
    names = stream_response.lower_names(headers)
    assert stream_response.media_type(headers, names) == _plain_media_type(headers)
    dropped = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive"}
    dropped |= {b"proxy-connection", b"te", b"trailer", b"upgrade", b"cache-control"}
    dropped |= {b"x-accel-buffering"} | ({b"content-encoding"} if decode else set())
    kept = [(n, v) for n, v in headers if n.lower() not in dropped]
    given = [v for n, v in headers if n.lower() == b"cache-control"]
    directives = [d.strip() for value in given for d in value.split(b",") if d.strip()]
    if b"no-transform" not in [d.lower() for d in directives]:
        directives.append(b"no-transform")
    added = [(b"cache-control", b", ".join(directives)), (b"x-accel-buffering", b"no")]
    assert stream_response.stream_headers(headers, decode=decode, names=names) == [
        *kept,
        *(added if given else stream_response.STREAM_HEADERS),
    ]
    found = stream_response.guarded(headers, 200, "POST", frozenset({b"text/event-stream"}))
    assert found is None or found[2] == names
