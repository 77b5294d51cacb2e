"""What StreamGuard does to a streaming response's framing: headers, encoding, terminal bytes.

Plain functions and one small decoder class, no I/O: the guard calls them once per stream
(headers, terminal event) or once per chunk (the decoder, only for a compressed body).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

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
STREAM_HEADERS = ((b"cache-control", b"no-cache, no-transform"), (b"x-accel-buffering", b"no"))
DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})

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


def media_type(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """(media type, content-encoding) of a response, both lower-cased, b"" when absent."""
    kind = encoding = b""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
        elif lowered == b"content-encoding":
            encoding = value.strip().lower()
    return kind, encoding


def guarded(
    headers: Iterable[tuple[bytes, bytes]],
    status: int,
    method: str | None,
    content_types: frozenset[bytes],
) -> tuple[bytes, bytes] | None:
    """(media type, content-encoding) when the guard treats this response as a stream, else
    None: its type is configured, any encoding is one it can decode, and it has a body."""
    kind, encoding = media_type(headers)
    if (
        kind not in content_types
        or (encoding and encoding not in DECODABLE)
        or status in (204, 304)
        or method == "HEAD"
    ):
        return None
    return kind, encoding


def stream_headers(
    headers: Iterable[tuple[bytes, bytes]], *, decode: bool
) -> list[tuple[bytes, bytes]]:
    """The response headers of a stream: framing and caching headers replaced."""
    kept = [
        (name, value)
        for name, value in headers
        if name.lower() not in _DROP and not (decode and name.lower() == b"content-encoding")
    ]
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
