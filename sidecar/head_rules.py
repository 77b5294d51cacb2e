"""The rules each request's heads go through, once per request, as plain loops over the
headers: what the proxy asks of a client request (`request_rules`), the upstream's response
headers for downstream (`response_headers`), a request's headers as uvicorn reads them
(`read_headers`) and the response head the traffic listener writes (`response_head`).

The Python twins of `sidecar/_heads.c`, which `sidecar.speedups` picks where it was built (this
module compiled by Cython stayed well behind it: docs/performance.md, "Cython for the frame").
The rules are written out one by one in `sidecar.headers`, and uvicorn's in
`sidecar.servers.response_head`'s docstring; the tests hold both twins to them.

A byte no header may hold is found by `bytes.translate` over all names, then all values, at
once: each bad byte is mapped to another byte, so the names or values come back unchanged
exactly when none is bad. Headers are `(bytes, bytes)` pairs; the request rules refuse
anything else with a `TypeError`, and the response head hands it to uvicorn's own loop.
"""

from __future__ import annotations

import http
import re
from collections.abc import Sequence
from typing import Any

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
# Request headers the proxy sets itself; the client's values are dropped. Content-Length is
# among them: the proxy writes the number it read (`declared_length`), not the client's
# spelling of it, which a strict upstream may refuse (h11 takes at most 20 digits).
REPLACED = frozenset(
    {
        b"host",
        b"accept-encoding",
        b"content-length",
        b"x-forwarded-for",
        b"x-forwarded-proto",
        b"x-forwarded-host",
    }
)
DROPPED = HOP_BY_HOP | REPLACED  # a request's, when its Connection names nothing more
VERSIONS = frozenset({"1.0", "1.1", "2"})  # not 0.9, nor "HTTP/2.0" in an HTTP/1 request line
# Names a request's `Connection` may not list: dropping them as hop-by-hop would forward a
# body without its framing (the upstream then reads it as the next request) or the request
# without its Host. `te` may be listed: RFC 9110 10.1.4 asks a client that sends TE to, and TE
# is dropped as hop-by-hop anyway; it frames nothing.
UNLISTABLE = frozenset({b"content-length", b"transfer-encoding", b"host"})

# A byte no header name or value may hold, on the way upstream and in the listener's response
# head alike (uvicorn's own rule): controls, DEL, and in a name the delimiters.
BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _marks(bad: re.Pattern[bytes]) -> bytes:
    """A `bytes.translate` table that changes exactly the bytes `bad` matches."""
    return bytes((byte ^ 1 if bad.match(bytes((byte,))) else byte) for byte in range(256))


_NAME_MARKS = _marks(BAD_NAME)
_VALUE_MARKS = _marks(BAD_VALUE)


def clean(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """No header name or value holds a byte it may not."""
    return _clean(b"".join([name for name, _ in headers]), b"".join([v for _, v in headers]))


def _clean(names: bytes, values: bytes) -> bool:
    """No byte in `names` (the names joined) or `values` (the values joined) that a header
    may not hold."""
    return names.translate(_NAME_MARKS) == names and values.translate(_VALUE_MARKS) == values


MAX_LENGTH_DIGITS = 19  # past leading zeros: every such number fits in 64 bits


def declared_length(value: bytes) -> int | None:
    """A `Content-Length` value's number, or None when it is not one: ASCII digits (bytes'
    `isdigit` knows no others) around ASCII whitespace, at most `MAX_LENGTH_DIGITS` of them
    after leading zeros. The bound is the rule, not `int()`'s: `int()` refuses past 4,300
    digits, leading zeros included, where httptools reads the same value as a small number."""
    digits = value.strip()
    if not digits.isdigit() or len(digits.lstrip(b"0")) > MAX_LENGTH_DIGITS:
        return None
    return int(digits.lstrip(b"0") or b"0")


def listed(value: bytes) -> set[bytes]:
    """The tokens of a comma-separated list (a `Connection` header's), stripped and
    lower-cased, empty ones left out."""
    tokens = {token.strip() for token in value.lower().split(b",")}
    tokens.discard(b"")
    return tokens


def _not_pair(item: object) -> TypeError:
    return TypeError(f"a header is not a pair of bytes: {item!r}")


# What the proxy asks of a client request's headers: their size on the wire, why their
# framing is unsafe (None: it is not), the declared Content-Length, chunked or not, and the
# headers to send upstream.
RequestRules = tuple[int, str | None, int | None, bool, list[tuple[bytes, bytes]]]


def request_rules(
    headers: Sequence[tuple[bytes, bytes]],
    http_version: str,
    authority: bytes,
    client: str | None,
    scheme: str,
) -> RequestRules:
    """`sidecar.headers`' request rules (`header_bytes`, `request_problem`,
    `content_length`, `chunked`, `request_headers`) in one pass over the headers."""
    size = lengths = encodings = hosts = 0
    length = encoding = host = None
    forwarded: list[bytes] = []
    named: set[bytes] | None = None  # the names Connection headers list, if any
    out = [(b"host", authority)]
    for item in headers:
        if len(item) != 2:
            raise _not_pair(item)
        name, value = item
        if type(name) is not bytes or type(value) is not bytes:
            raise _not_pair(item)
        size += len(name) + len(value) + 4
        key = name.lower()
        if key not in DROPPED:
            out.append((key, value))
        elif key == b"content-length":
            lengths += 1
            if length is None:
                length = value
        elif key == b"transfer-encoding":
            encodings += 1
            encoding = value
        elif key == b"host":
            hosts += 1
            if host is None:
                host = value
        elif key == b"connection":
            named = listed(value) if named is None else named | listed(value)
        elif key == b"x-forwarded-for":
            forwarded.append(value)

    declared = None if length is None else declared_length(length)
    chunked = encoding is not None and encoding.rpartition(b",")[2].strip().lower() == b"chunked"
    if http_version not in VERSIONS:
        problem: str | None = f"HTTP version {http_version!r} is not served"
    elif not clean(headers):
        problem = "a header contains a control character"
    elif named is not None and not UNLISTABLE.isdisjoint(named):
        problem = "Connection names Content-Length, Transfer-Encoding or Host"
    elif lengths and encodings:
        problem = "both Content-Length and Transfer-Encoding"
    elif lengths > 1:
        problem = "more than one Content-Length"
    elif lengths and declared is None:
        problem = "Content-Length is not a number of at most 19 digits"
    elif encodings and not chunked:
        problem = "Transfer-Encoding does not end in chunked"
    elif hosts > 1 or (hosts == 0 and http_version == "1.1"):
        problem = "an HTTP/1.1 request needs exactly one Host"
    else:
        problem = None

    if named is not None:  # the names it lists are dropped too (but the Host set above)
        out[1:] = [pair for pair in out[1:] if pair[0] not in named]
    out.append((b"accept-encoding", b"identity"))
    if named is not None and b"x-forwarded-for" in named:
        forwarded = []
    parts = [part for part in map(bytes.strip, forwarded) if part]
    if client:
        parts.append(client.encode("latin-1"))
    if parts:
        out.append((b"x-forwarded-for", b", ".join(parts)))
    out.append((b"x-forwarded-proto", scheme.encode("latin-1")))
    if host is not None and (named is None or b"host" not in named):
        out.append((b"x-forwarded-host", host))
    return size, problem, declared, chunked, out


def response_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers to send downstream: names lower-cased, hop-by-hop
    ones and those any `Connection` header lists dropped, the rest in order. `Content-Length`
    stays (a non-streaming body is relayed byte-identical); StreamGuard drops it for
    streaming responses."""
    out = []
    named: set[bytes] | None = None
    for item in headers:
        if len(item) != 2:
            raise _not_pair(item)
        name, value = item
        if type(name) is not bytes or type(value) is not bytes:
            raise _not_pair(item)
        key = name.lower()
        if key not in HOP_BY_HOP:
            out.append((key, value))
        elif key == b"connection":
            named = listed(value) if named is None else named | listed(value)
    if named is not None:
        return [pair for pair in out if pair[0] not in named]
    return out


def read_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    """What uvicorn's protocol does per header, for all of a request's headers, in place:
    names lower-cased, values without the trailing blanks llhttp keeps. Is one of them
    `expect: 100-continue`?"""
    expect = False
    for i, (name, value) in enumerate(headers):
        name = name.lower()
        value = value.rstrip(b" \t")
        headers[i] = (name, value)
        if name == b"expect" and value.lower() == b"100-continue":
            expect = True
    return expect


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %b\r\n" % (status, phrase)


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"

# What a head decides beside its bytes: chunked (None: neither framing, a bodyless
# response), the Content-Length still owed, and whether the connection is kept alive.
Head = tuple[bytes, bool | None, int, bool]


def response_head(
    status: int, headers: Sequence[Any], keep_alive: bool, head_request: bool
) -> Head:
    """The head for `status` and `headers` (the server's default headers first) on a
    connection kept alive or not, answering a HEAD request or not: uvicorn's loop, its
    checks on all names and values at once. A head they refuse, or with a header not a
    pair of bytes, is uvicorn's loop's (`_plain`), which raises what uvicorn raises."""
    status_line = STATUS_LINES[status]
    if type(headers) is not list and type(headers) is not tuple:
        return _plain(status_line, status, headers, keep_alive, head_request)
    content = [status_line]
    chunked = None
    length = 0
    close = False
    for item in headers:
        if type(item) is not tuple or len(item) != 2:
            return _plain(status_line, status, headers, keep_alive, head_request)
        name, value = item
        if type(name) is not bytes or type(value) is not bytes:
            return _plain(status_line, status, headers, keep_alive, head_request)
        key = name.lower()
        if key in _FRAMING:
            if key == b"content-length":
                if chunked is None:
                    try:
                        length = int(value.decode())
                    except ValueError:  # or is a bad byte before it? uvicorn's loop says
                        return _plain(status_line, status, headers, keep_alive, head_request)
                    chunked = False
            elif key == b"transfer-encoding":
                if value.lower() == b"chunked":
                    length = 0
                    chunked = True
            elif b"close" in listed(value):
                close = True
        content.extend((key, b": ", value, b"\r\n"))
    if not _clean(b"".join(content[1::4]), b"".join(content[3::4])):
        return _plain(status_line, status, headers, keep_alive, head_request)  # raises
    return _ending(content, status, chunked, length, keep_alive, close, head_request)


def _ending(
    content: list[bytes],
    status: int,
    chunked: bool | None,
    length: int,
    keep_alive: bool,
    close: bool,
    head_request: bool,
) -> Head:
    keep_alive = keep_alive and not close
    if not keep_alive and not close:
        content.append(_CLOSE)
    if chunked is None and not head_request and status != 204 and status != 304:
        chunked = True
        content.append(_CHUNKED)
    content.append(b"\r\n")
    return b"".join(content), chunked, length, keep_alive


def _plain(
    status_line: bytes, status: int, headers: Sequence[Any], keep_alive: bool, head_request: bool
) -> Head:
    """uvicorn's loop, one header at a time, with uvicorn's regexes: for the heads the loop
    above does not take, and to raise, for a bad one, what uvicorn raises at the header
    where it raises it."""
    content = [status_line]
    chunked = None
    length = 0
    close = False
    for item in headers:
        if isinstance(item, (tuple, list)) and len(item) < 2:  # in CPython's words
            raise ValueError(f"not enough values to unpack (expected 2, got {len(item)})")
        name, value = item
        if BAD_NAME.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if BAD_VALUE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        name = name.lower()
        if name == b"content-length" and chunked is None:
            length = int(value.decode())
            chunked = False
        elif name == b"transfer-encoding" and value.lower() == b"chunked":
            length = 0
            chunked = True
        elif name == b"connection" and b"close" in [
            token.strip() for token in value.lower().split(b",")
        ]:
            close = True
        content.extend([name, b": ", value, b"\r\n"])
    return _ending(content, status, chunked, length, keep_alive, close, head_request)
