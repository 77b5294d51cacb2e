"""Header and request-target rules of the proxy: pure functions, no I/O.

Headers are ASGI-style `(name, value)` byte pairs. Names coming from the ASGI server are
already lower-case; names coming from the upstream (httpcore keeps the wire casing) are
lower-cased here, because ASGI asks for lower-case names and every rule compares them.

Deliberate choices:
- `Transfer-Encoding` and `Content-Length` are framing, not content: the request rule drops
  `Transfer-Encoding` with the other hop-by-hop headers and the proxy re-adds
  `transfer-encoding: chunked` itself when it streams a body of unknown length.
- `X-Forwarded-Proto` and `X-Forwarded-Host` from the client are replaced, not appended to:
  they describe the hop the proxy received, which only the proxy knows.
"""

from __future__ import annotations

from collections.abc import Iterable

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# Request headers the proxy sets itself; the client's values are dropped.
_REPLACED = frozenset(
    {b"host", b"accept-encoding", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host"}
)


def connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The header names listed in every `Connection` header, lower-cased (RFC 9110 7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            for token in value.split(b","):
                token = token.strip().lower()
                if token:
                    tokens.add(token)
    return frozenset(tokens)


def strip_hop_by_hop(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Lower-cased headers without hop-by-hop ones and without those named in `Connection`."""
    pairs = [(name.lower(), value) for name, value in headers]
    drop = HOP_BY_HOP
    for name, _ in pairs:
        if name == b"connection":  # it names more to drop (most requests carry none)
            drop = HOP_BY_HOP | connection_tokens(pairs)
            break
    return [pair for pair in pairs if pair[0] not in drop]


def forwarded_for(existing: Iterable[bytes], client: str | None) -> bytes | None:
    """`X-Forwarded-For`: the client's values joined in order, then the peer's address.

    None when there is nothing to send (no prior values and no known peer).
    """
    parts = [value.strip() for value in existing if value.strip()]
    if client:
        parts.append(client.encode("latin-1"))
    return b", ".join(parts) if parts else None


def chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True when the message's final transfer coding is `chunked`."""
    codings = [
        coding.strip().lower()
        for name, value in headers
        if name.lower() == b"transfer-encoding"
        for coding in value.split(b",")
    ]
    return bool(codings) and codings[-1] == b"chunked"


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The declared `Content-Length`, or None when absent or not a valid number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# CR, LF, NUL as ints: `13 in value` is one memchr, while `b"\r" in value` first tries the
# needle as an integer inside CPython, raising and clearing a TypeError.
_FORBIDDEN_IN_HEADERS = (13, 10, 0)
_VERSIONS = frozenset({"1.0", "1.1", "2"})  # not 0.9, nor "HTTP/2.0" in an HTTP/1 request line


def request_problem(headers: Iterable[tuple[bytes, bytes]], http_version: str) -> str | None:
    """Why a client request's framing is unsafe to forward, or None when it is fine.

    Request smuggling lives in the gap between two parsers' readings of the same bytes, so
    the proxy refuses (400) anything a second parser could read differently: both
    `Content-Length` and `Transfer-Encoding`, more than one `Content-Length` or one that is
    not a plain number, a `Transfer-Encoding` whose last coding is not `chunked`, zero or
    several `Host` headers on HTTP/1.1 (RFC 9112 3.2), CR, LF or NUL in a header, and a
    version other than 1.0, 1.1 or 2 (`GET /` alone parses as HTTP/0.9). The
    ASGI server (httptools, h11, h2) rejects most of these first; this is the second line
    for what one of them lets through.
    """
    if http_version not in _VERSIONS:
        return f"HTTP version {http_version!r} is not served"
    lengths: list[bytes] = []
    codings: list[bytes] = []
    hosts = 0
    for name, value in headers:
        for c in _FORBIDDEN_IN_HEADERS:
            if c in value or c in name:
                return "a header contains CR, LF or NUL"
        name = name.lower()
        if name == b"content-length":
            lengths.append(value.strip())
        elif name == b"transfer-encoding":
            codings.extend(c.strip().lower() for c in value.split(b","))
        elif name == b"host":
            hosts += 1
    if lengths and codings:
        return "both Content-Length and Transfer-Encoding"
    if len(lengths) > 1:
        return "more than one Content-Length"
    if lengths and not lengths[0].isdigit():
        return "Content-Length is not a number"
    if codings and codings[-1] != b"chunked":
        return "Transfer-Encoding does not end in chunked"
    if hosts > 1 or (hosts == 0 and http_version == "1.1"):
        return "an HTTP/1.1 request needs exactly one Host"
    return None


def header_bytes(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """Size of the header block as on the wire: `name: value\\r\\n` per header."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def request_headers(
    headers: Iterable[tuple[bytes, bytes]],
    *,
    authority: bytes,
    client: str | None,
    scheme: str,
) -> Headers:
    """The headers to send upstream for a client request's headers.

    Drops hop-by-hop headers (and those named in `Connection`), sets `Host` to the
    upstream's authority, asks for `Accept-Encoding: identity`, and adds
    `X-Forwarded-For` (appending the peer), `X-Forwarded-Proto` and `X-Forwarded-Host`.
    `Content-Length` is kept; `Transfer-Encoding` is the caller's business.
    """
    out = [(b"host", authority)]
    prior_xff: list[bytes] = []
    client_host: bytes | None = None
    for name, value in strip_hop_by_hop(headers):
        if name not in _REPLACED:
            out.append((name, value))
        elif name == b"x-forwarded-for":
            prior_xff.append(value)
        elif name == b"host" and client_host is None:
            client_host = value
    out.append((b"accept-encoding", b"identity"))
    xff = forwarded_for(prior_xff, client)
    if xff is not None:
        out.append((b"x-forwarded-for", xff))
    out.append((b"x-forwarded-proto", scheme.encode("latin-1")))
    if client_host is not None:
        out.append((b"x-forwarded-host", client_host))
    return out


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The upstream's response headers to send downstream: lower-cased, hop-by-hop dropped.

    `Content-Length` stays (a non-streaming body is relayed byte-identical); StreamGuard
    drops it for streaming responses.
    """
    return strip_hop_by_hop(headers)


def origin_form(target: bytes) -> bytes:
    """The origin-form of a request target: `/path?query` even from an absolute-form target.

    Servers may hand the absolute form (`http://other.example/x`) through as the raw path;
    the proxy keeps only the path so the target can never name another origin. `*`
    (`OPTIONS *`) and origin-form targets are returned unchanged.
    """
    if target.startswith(b"/") or target == b"*":
        return target
    scheme_end = target.find(b"://")
    if scheme_end < 0:
        return b"/" + target
    path_start = target.find(b"/", scheme_end + 3)
    query_start = target.find(b"?", scheme_end + 3)
    if path_start < 0 or (0 <= query_start < path_start):
        return b"/" + (target[query_start:] if query_start >= 0 else b"")
    return target[path_start:]
