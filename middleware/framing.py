"""What StreamGuard does to a streaming response's framing: headers, encoding, terminal bytes.

Plain functions and one small decoder class, no I/O: the guard calls them once per stream
(headers, terminal event) or once per chunk (the decoder, only for a compressed body).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import itemgetter, not_

from middleware.dialects import Dialect
from middleware.sse import LineState

# Headers a stream never forwards: framing the server redoes, hop-by-hop headers, and the
# two the guard sets itself. Content-Encoding is handled apart (decoded or kept).
_DROP = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
        b"cache-control",
        b"x-accel-buffering",
    }
)
_DROP_DECODED = _DROP | {b"content-encoding"}  # a body the guard decodes goes out plain
STREAM_HEADERS = ((b"cache-control", b"no-cache, no-transform"), (b"x-accel-buffering", b"no"))
DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})
_name = itemgetter(0)

# Before writing a terminal event, close whatever the stream left open so the event starts at
# an event boundary. A half-written line or event cannot be withdrawn in SSE: it is completed
# and dispatched, and the reader's parser then sees the error event right after it.
_CLOSE_OPEN = {
    LineState.EVENT: b"",
    LineState.LINE: b"\n",
    LineState.MID: b"\n\n",
    LineState.CR_LINE: b"\n\n",
    LineState.CR_EVENT: b"\n",
}


def lower_names(headers: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """The names, lower-cased. A C-level pass over all headers (no Python per header): this
    runs once per response, and its result serves `guarded` and `stream_headers` alike."""
    return list(map(bytes.lower, map(_name, headers)))


def _last(headers: Sequence[tuple[bytes, bytes]], names: list[bytes], name: bytes) -> bytes | None:
    """The value of the last header called `name`, or None."""
    if name not in names:
        return None
    return headers[len(names) - 1 - names[::-1].index(name)][1]


def media_type(headers: Sequence[tuple[bytes, bytes]], names: list[bytes]) -> tuple[bytes, bytes]:
    """(media type, content-encoding) of a response, both lower-cased, b"" when absent (the
    last header of each name counts). `names`: `lower_names(headers)`."""
    kind = _last(headers, names, b"content-type")
    encoding = _last(headers, names, b"content-encoding")
    return (
        b"" if kind is None else kind.split(b";", 1)[0].strip().lower(),
        b"" if encoding is None else encoding.strip().lower(),
    )


def guarded(
    headers: Sequence[tuple[bytes, bytes]],
    status: int,
    method: str | None,
    content_types: frozenset[bytes],
) -> tuple[bytes, bytes, list[bytes]] | None:
    """(media type, content-encoding, the names lower-cased) when the guard treats this
    response as a stream, else None: its type is configured, any encoding is one it can
    decode, and it has a body. The names serve `stream_headers`: read once a response."""
    names = lower_names(headers)
    kind, encoding = media_type(headers, names)
    if (
        kind not in content_types
        or (encoding and encoding not in DECODABLE)
        or status in (204, 304)
        or method == "HEAD"
    ):
        return None
    return kind, encoding, names


def stream_headers(
    headers: Sequence[tuple[bytes, bytes]], *, decode: bool, names: list[bytes]
) -> list[tuple[bytes, bytes]]:
    """The response headers of a stream: framing and caching headers replaced. `names`:
    `lower_names(headers)` (`guarded` hands them on)."""
    drop = _DROP_DECODED if decode else _DROP
    kept = list(compress(headers, map(not_, map(drop.__contains__, names))))
    kept.extend(STREAM_HEADERS)
    return kept


class Inflater:
    """Incremental gzip/deflate decoder for a body that arrived compressed anyway.

    "deflate" is meant to be zlib-wrapped (RFC 9110) but servers also send raw deflate;
    the first bytes decide which.
    """

    __slots__ = ("_decoder", "_raw_fallback")

    def __init__(self, encoding: bytes) -> None:
        gzip = encoding in (b"gzip", b"x-gzip")
        self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        self._raw_fallback = not gzip

    def decompress(self, data: bytes) -> bytes:
        try:
            out = self._decoder.decompress(data)
        except zlib.error:
            if not self._raw_fallback:
                raise
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._decoder.decompress(data)
        self._raw_fallback = False
        return out

    def flush(self) -> bytes:
        return self._decoder.flush()


def terminal_event(
    dialect: Dialect | None, error: dict[str, str], state: LineState, *, sse: bool
) -> bytes:
    """The bytes that end a stream with an error, from where the stream stands now."""
    if not sse:
        opener = b"" if state in (LineState.EVENT, LineState.LINE) else b"\n"
        return opener + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n"
    if dialect is None:
        body = b"data: " + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n\n"
    else:
        body = dialect.error_event(error)
    return _CLOSE_OPEN[state] + body


def error_response(
    status: int,
    body: bytes,
    *,
    retry_after: int | None = None,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> tuple[dict[str, object], dict[str, object]]:
    """The two ASGI messages of a JSON error response sent before any header went out."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    start = {"type": "http.response.start", "status": status, "headers": headers}
    return start, {"type": "http.response.body", "body": body, "more_body": False}
