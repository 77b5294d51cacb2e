"""Header and request-target rules of the proxy: pure functions, no I/O.

Headers are ASGI-style `(name, value)` byte pairs. Names coming from the ASGI server are
already lower-case; names coming from the upstream (httpcore keeps the wire casing) are
lower-cased here, because ASGI asks for lower-case names and every rule compares them.

Deliberate choices:
- `Transfer-Encoding` and `Content-Length` are framing, not content: the request rule drops
  both, and the proxy writes the one that frames the body it streams
  (`sidecar.upstream.framing` holds every request sent to that rule).
- `X-Forwarded-Proto` and `X-Forwarded-Host` from the client are replaced, not appended to:
  they describe the hop the proxy received, which only the proxy knows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress
from operator import itemgetter, not_

from sidecar import head_rules
from sidecar.head_rules import (
    DROPPED,
    HOP_BY_HOP,
    REPLACED,
    UNLISTABLE,
    VERSIONS,
    RequestRules,
    clean,
    listed,
)
from sidecar.head_rules import declared_length as declared_length  # `upstream.framing`'s
from sidecar.speedups import heads

Headers = list[tuple[bytes, bytes]]
Pairs = Sequence[tuple[bytes, bytes]]


# The rules one by one, as a reader (and the tests) ask them; the proxy asks them all at once,
# in `request_rules` below, one pass over the headers.
_name = itemgetter(0)
_value = itemgetter(1)


def lower_names(headers: Pairs) -> list[bytes]:
    """Every header's name, lower-cased, in order. The request rules below take it as
    `names` from a caller that asks several of them about the same headers (the proxy), so
    that it is made once per request; each makes it itself when not given."""
    return list(map(bytes.lower, map(_name, headers)))


def _values(headers: Pairs, names: list[bytes], name: bytes) -> list[bytes]:
    """The values of every header called `name` (`names`: `lower_names(headers)`)."""
    return [value for lower, (_, value) in zip(names, headers, strict=True) if lower == name]


def _kept(headers: Pairs, names: list[bytes], drop: frozenset[bytes]) -> Headers:
    """The headers whose lower-cased name is not in `drop`, with that name, in order."""
    pairs = zip(names, map(_value, headers), strict=True)
    return list(compress(pairs, map(not_, map(drop.__contains__, names))))


def connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The header names listed in every `Connection` header, lower-cased (RFC 9110 7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens |= listed(value)
    return frozenset(tokens)


def _hop_by_hop(headers: Pairs, names: list[bytes]) -> frozenset[bytes]:
    """The names this message drops as hop-by-hop: the nine, and any named in `Connection`
    (most messages carry none)."""
    if b"connection" in names:
        return HOP_BY_HOP | connection_tokens(headers)
    return HOP_BY_HOP


def strip_hop_by_hop(headers: Pairs) -> Headers:
    """Lower-cased headers without hop-by-hop ones and without those named in `Connection`."""
    names = lower_names(headers)
    return _kept(headers, names, _hop_by_hop(headers, names))


def forwarded_for(existing: Iterable[bytes], client: str | None) -> bytes | None:
    """`X-Forwarded-For`: the client's values joined in order, then the peer's address.

    None when there is nothing to send (no prior values and no known peer).
    """
    parts = [value.strip() for value in existing if value.strip()]
    if client:
        parts.append(client.encode("latin-1"))
    return b", ".join(parts) if parts else None


def _codings(headers: Pairs, names: list[bytes]) -> list[bytes]:
    """Every transfer coding of every `Transfer-Encoding` header, in order, lower-cased."""
    return [
        coding.strip().lower()
        for value in _values(headers, names, b"transfer-encoding")
        for coding in value.split(b",")
    ]


def chunked(headers: Pairs, names: list[bytes] | None = None) -> bool:
    """True when the message's final transfer coding is `chunked`."""
    if names is None:
        names = lower_names(headers)
    if b"transfer-encoding" not in names:
        return False
    # The final coding is the last one of the last Transfer-Encoding header (`_codings`'
    # last): found without listing them all, as the upstream's response head asks this.
    last = len(names) - 1 - names[::-1].index(b"transfer-encoding")
    return headers[last][1].rpartition(b",")[2].strip().lower() == b"chunked"


def content_length(headers: Pairs, names: list[bytes] | None = None) -> int | None:
    """The declared `Content-Length` (the first), or None when absent or not a valid number."""
    if names is None:
        names = lower_names(headers)
    if b"content-length" not in names:
        return None
    return declared_length(headers[names.index(b"content-length")][1])


def request_problem(
    headers: Pairs, http_version: str, names: list[bytes] | None = None
) -> str | None:
    """Why a client request's framing is unsafe to forward, or None when it is fine.

    Request smuggling lives in the gap between two parsers' readings of the same bytes, so
    the proxy refuses (400) anything a second parser could read differently: both
    `Content-Length` and `Transfer-Encoding`, more than one `Content-Length` or one that is
    not a plain number, a `Transfer-Encoding` whose last coding is not `chunked`, zero or
    several `Host` headers on HTTP/1.1 (RFC 9112 3.2), CR, LF or NUL in a header, and a
    version other than 1.0, 1.1 or 2 (`GET /` alone parses as HTTP/0.9). So are a control
    byte in a header (any but HTAB in a value) and a `Connection` that lists a framing header
    (`UNLISTABLE`). The ASGI server (httptools, h11, h2) rejects most of these first; this
    is the second line for what one of them lets through.
    """
    if http_version not in VERSIONS:
        return f"HTTP version {http_version!r} is not served"
    if not clean(headers):
        return "a header contains a control character"
    if names is None:
        names = lower_names(headers)
    if b"connection" in names and not UNLISTABLE.isdisjoint(connection_tokens(headers)):
        return "Connection names Content-Length, Transfer-Encoding or Host"
    lengths = names.count(b"content-length")
    encoded = b"transfer-encoding" in names
    if lengths and encoded:
        return "both Content-Length and Transfer-Encoding"
    if lengths > 1:
        return "more than one Content-Length"
    if lengths and declared_length(headers[names.index(b"content-length")][1]) is None:
        return "Content-Length is not a number of at most 19 digits"
    if encoded and _codings(headers, names)[-1] != b"chunked":
        return "Transfer-Encoding does not end in chunked"
    hosts = names.count(b"host")
    if hosts > 1 or (hosts == 0 and http_version == "1.1"):
        return "an HTTP/1.1 request needs exactly one Host"
    return None


def header_bytes(headers: Pairs) -> int:
    """Size of the header block as on the wire: `name: value\\r\\n` per header."""
    return sum(map(len, chain.from_iterable(headers))) + 4 * len(headers)


def request_headers(
    headers: Pairs,
    *,
    authority: bytes,
    client: str | None,
    scheme: str,
    names: list[bytes] | None = None,
) -> Headers:
    """The headers to send upstream for a client request's headers.

    Drops hop-by-hop headers (and those named in `Connection`), sets `Host` to the
    upstream's authority, asks for `Accept-Encoding: identity`, and adds
    `X-Forwarded-For` (appending the peer), `X-Forwarded-Proto` and `X-Forwarded-Host`.
    Framing is the caller's business: `Content-Length` and `Transfer-Encoding` are dropped,
    and the proxy writes the one that frames the body it sends.
    """
    if names is None:
        names = lower_names(headers)
    hop = _hop_by_hop(headers, names)
    out = [(b"host", authority)]
    out += _kept(headers, names, DROPPED if hop is HOP_BY_HOP else hop | REPLACED)
    out.append((b"accept-encoding", b"identity"))
    # The client's own X-Forwarded-For and Host, unless its Connection named them.
    prior = []
    if b"x-forwarded-for" in names and b"x-forwarded-for" not in hop:
        prior = _values(headers, names, b"x-forwarded-for")
    xff = forwarded_for(prior, client)
    if xff is not None:
        out.append((b"x-forwarded-for", xff))
    out.append((b"x-forwarded-proto", scheme.encode("latin-1")))
    if b"host" in names and b"host" not in hop:
        out.append((b"x-forwarded-host", headers[names.index(b"host")][1]))
    return out


# Every rule above that the proxy asks of one request, and the upstream's response headers
# for downstream, in one pass over the headers each (`sidecar.head_rules`, or its compiled twin
# `sidecar/_heads.c` where it was built): they are on the path to each stream's first token.
request_rules: Callable[[Pairs, str, bytes, str | None, str], RequestRules] = (
    head_rules.request_rules if heads is None else heads.request_rules
)
response_headers: Callable[[Pairs], Headers] = (
    head_rules.response_headers if heads is None else heads.response_headers
)


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
