"""The HTTP/1.1 response head the traffic listener writes for an `http.response.start`: by
uvicorn's rules (its httptools protocol, the release named in `uvicorn_internals.CHECKED`),
with the header checks done on all of a head's names, then all its values, at once.

A plain function of the message and the request: no I/O, no uvicorn import. uvicorn's rules,
which the tests hold this to by comparing the two on the same messages:
- the status line from `http.HTTPStatus` (no phrase for a code it does not know; a status
  outside 100..599 is a `KeyError`);
- a name with a control byte, a space or one of `()<>@,;:\\"[]={}` (RFC 9110's delimiters
  but `/` and `?`; bytes above 0x7f pass), or a value with a control byte other than tab
  (CR and LF among them: no header smuggled in), is refused:
  `RuntimeError("Invalid HTTP header name.")` / `("Invalid HTTP header value.")`, for the
  first bad header in order, its name before its value;
- names are written lower-cased, values as given;
- framing: the first `content-length` (unless a `transfer-encoding: chunked` came before
  it) gives a length (`int()` of it: a `ValueError` when it is not a number); a
  `transfer-encoding: chunked` makes the body chunked; with neither, the body is chunked
  and the head says so, except for HEAD, 204 and 304, which have no body;
- a `connection` header with the token `close` ends keep-alive; a connection not kept alive
  says `connection: close` unless the app already did.

Only a head with one of the three framing names pays for a loop over its headers; a bad or
unusual one (a name not `bytes`, an item not a pair) is redone by the plain loop, uvicorn's,
which raises what uvicorn raises.

Two twins, the same rules: `_response_head` here, and the compiled one in
`sidecar/_heads.c` (picked as `response_head` where it was built, as `sidecar.speedups`
picks), which writes the usual head itself and hands any other to `_response_head`. The head
is on the path to each stream's first token.
"""

from __future__ import annotations

import http
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.headers import BAD_NAME as _BAD_NAME
from sidecar.headers import BAD_VALUE as _BAD_VALUE
from sidecar.speedups import heads

_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_LINE = b"%b: %b\r\n"
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_BODYLESS = (204, 304)


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %b\r\n" % (status, phrase)


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}

# What a head decides beside its bytes: chunked (None: neither framing, a bodyless
# response), the Content-Length still owed, and whether the connection is kept alive.
Head = tuple[bytes, bool | None, int, bool]


def _response_head(
    status: int, headers: Sequence[Any], keep_alive: bool, head_request: bool
) -> Head:
    """The head for `status` and `headers` (the server's default headers first) on a
    connection kept alive or not, answering a HEAD request or not."""
    status_line = STATUS_LINES[status]
    try:
        names, values = zip(*headers, strict=True)
        names = tuple(map(bytes.lower, names))
        bad = _BAD_NAME.search(b"".join(names)) or _BAD_VALUE.search(b"".join(values))
        lines = b"".join(map(_LINE.__mod__, zip(names, values, strict=True)))
    except (TypeError, ValueError):  # no headers, or headers of an unusual shape
        return _plain(status_line, status, headers, keep_alive, head_request)
    if bad:
        return _plain(status_line, status, headers, keep_alive, head_request)  # raises

    state = _UNFRAMED
    if not _FRAMING.isdisjoint(names):
        for name, value in zip(names, values, strict=True):
            state = _framing(name, value, state)
    chunked, length, close = state
    keep_alive = keep_alive and not close
    if not keep_alive and not close:
        lines += _CLOSE
    if chunked is None and not head_request and status not in _BODYLESS:
        chunked = True
        lines += _CHUNKED
    return b"%b%b\r\n" % (status_line, lines), chunked, length, keep_alive


# Framing so far: chunked (None: not decided), the Content-Length owed, `close` asked for.
Framing = tuple[bool | None, int, bool]
_UNFRAMED: Framing = (None, 0, False)


def _framing(name: bytes, value: bytes, state: Framing) -> Framing:
    """uvicorn's framing rule for one more header (its name lower-cased), in order."""
    chunked, length, close = state
    if name == b"content-length" and chunked is None:
        return False, int(value.decode()), close
    if name == b"transfer-encoding" and value.lower() == b"chunked":
        return True, 0, close
    if name == b"connection" and _says_close(value):
        return chunked, length, True
    return state


def _says_close(value: bytes) -> bool:
    return b"close" in [token.lower().strip() for token in value.split(b",")]


def _plain(
    status_line: bytes, status: int, headers: Sequence[Any], keep_alive: bool, head_request: bool
) -> Head:
    """uvicorn's loop, one header at a time: for the heads the joined checks do not take,
    and to raise, for a bad one, what uvicorn raises at the header where it raises it."""
    content = [status_line]
    state = _UNFRAMED
    for name, value in headers:
        if _BAD_NAME.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if _BAD_VALUE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        name = name.lower()
        state = _framing(name, value, state)
        content.extend([name, b": ", value, b"\r\n"])
    chunked, length, close = state
    keep_alive = keep_alive and not close
    if not keep_alive and not close:
        content.append(_CLOSE)
    if chunked is None and not head_request and status not in _BODYLESS:
        chunked = True
        content.append(_CHUNKED)
    content.append(b"\r\n")
    return b"".join(content), chunked, length, keep_alive


response_head: Callable[[int, Sequence[Any], bool, bool], Head] = (
    _response_head if heads is None else heads.response_head
)
