"""The framing invariant of every HTTP/1.1 request sent upstream, checked where its head is
written: pure functions, no I/O.

A request that has a body carries exactly one framing header, and it matches the bytes
sent: `Content-Length: n` with exactly n bytes, or `Transfer-Encoding: chunked` that the
exchange writes itself. A request without a body carries neither (`Content-Length: 0` is
allowed: some servers ask it of a body-less POST, and zero bytes match it). Anything else
is refused before a byte goes out, whichever path built the head: an upstream on a pooled
keep-alive connection that read the head one way and the bytes another would take the rest
as the next request, another client's answer included (request smuggling).

The proxy refuses what a client could use to break this (`sidecar.headers.request_problem`:
a `Connection` naming a framing header, a Content-Length that is not a plain number, both
headers at once); this is the line no future path can forget.
"""

from __future__ import annotations

import re

from sidecar.headers import declared_length, lower_names
from sidecar.upstream.errors import RequestFramingError
from sidecar.upstream.types import Headers

CHUNKED = -1  # `request_framing`'s answer for a chunked body
# RFC 9110 5.6.2 `token` for the method; a request-target holds no SP, CTL or DEL (RFC 9112
# 3.2), or the request line splits where the upstream reads it.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")


def request_line_problem(method: bytes, target: bytes) -> str | None:
    """Why `method` and `target` cannot make an HTTP/1.1 request line, or None."""
    if _TOKEN.fullmatch(method) is None:
        return "the method is not a token"
    if not target or _BAD_TARGET.search(target) is not None:
        return "the request target holds a space or a control character"
    return None


def request_framing(headers: Headers) -> int | None:
    """The body framing `headers` declare: `CHUNKED`, a Content-Length, or None (no body).

    Raises `RequestFramingError` for anything but exactly one well-formed framing header.
    """
    names = lower_names(headers)
    lengths = names.count(b"content-length")
    encodings = names.count(b"transfer-encoding")
    if lengths + encodings > 1:
        raise RequestFramingError("refusing a request with more than one framing header")
    if encodings:
        if headers[names.index(b"transfer-encoding")][1] != b"chunked":
            raise RequestFramingError("refusing a transfer coding the proxy did not write")
        return CHUNKED
    if lengths:
        length = declared_length(headers[names.index(b"content-length")][1])
        if length is None:
            raise RequestFramingError("refusing a Content-Length that is not a number")
        return length
    return None


def check_piece(framing: int | None, sent: int, piece: int) -> None:
    """Refuse a body piece of `piece` bytes after `sent` that the framing does not allow."""
    if framing is None:
        raise RequestFramingError("refusing a request body with no framing header")
    if framing != CHUNKED and sent + piece > framing:
        raise RequestFramingError("refusing more body bytes than the Content-Length")


def check_end(framing: int | None, sent: int) -> None:
    """Refuse a body that ended short of its Content-Length."""
    if framing is not None and framing != CHUNKED and sent != framing:
        raise RequestFramingError("refusing a body shorter than its Content-Length")
