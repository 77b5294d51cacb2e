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
from middleware.errors import CompressionRatioExceeded, UpstreamProtocolError
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
        b"cache-control",  # merged: `cache_control`
        b"x-accel-buffering",
    }
)
_DROP_DECODED = _DROP | {b"content-encoding"}  # a body the guard decodes goes out plain
STREAM_HEADERS = ((b"cache-control", b"no-cache, no-transform"), (b"x-accel-buffering", b"no"))
_NO_BUFFERING = STREAM_HEADERS[1]
DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})
# A compressed body is inflated in pieces of at most this many bytes, the next one made when
# the reader took the last (`Inflater`, `relay.Relay._inflate`): what a stream holds for it
# stays bounded whatever the body inflates to.
INFLATE_STEP = 64 * 1024
# Past this ratio of inflated to compressed bytes a body is a bomb, not a stream: SSE gzips
# ~10-20x (an event flushed at a time), a long run of identical token chunks squeezed whole
# ~230x, while deflate tops out at ~1030x on a run of one byte. Judged only once this much
# came out, so that a short, very regular start (a padding comment) is not taken for one.
INFLATE_MAX_RATIO = 500
INFLATE_RATIO_AFTER = 1024 * 1024
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
    """The response headers of a stream: framing headers dropped, `X-Accel-Buffering: no`,
    and `Cache-Control` merged, never weakened. `names`: `lower_names(headers)` (`guarded`
    hands them on)."""
    drop = _DROP_DECODED if decode else _DROP
    kept = list(compress(headers, map(not_, map(drop.__contains__, names))))
    if b"cache-control" not in names:
        kept.extend(STREAM_HEADERS)  # the app said nothing: no-cache, no-transform
        return kept
    kept.append((b"cache-control", cache_control(headers, names)))
    kept.append(_NO_BUFFERING)
    return kept


def cache_control(headers: Sequence[tuple[bytes, bytes]], names: list[bytes]) -> bytes:
    """The app's Cache-Control directives, every one kept (`no-store`, `private`, `max-age`
    and the rest: a response the app said no cache may store stays so), in one header, with
    `no-transform` added where the app did not say it: no hop may recompress or buffer the
    stream."""
    directives = [
        directive.strip()
        for name, (_, value) in zip(names, headers, strict=True)
        if name == b"cache-control"
        for directive in value.split(b",")
        if directive.strip()
    ]
    if not any(d.lower() == b"no-transform" for d in directives):
        directives.append(b"no-transform")
    return b", ".join(directives)


class Inflater:
    """Incremental gzip/deflate decoder for a body that arrived compressed anyway.

    Bounded whatever the compression ratio: `decompress` takes a compressed chunk and hands
    out at most `INFLATE_STEP` bytes of what it inflates to, `more` the next piece, and the
    rest stays compressed (zlib's `unconsumed_tail`) until the relay asks, which it does
    once the reader took the previous piece. What a stream holds for this is its one
    compressed chunk, one piece and zlib's 32 KiB window. A body that inflates past
    `INFLATE_MAX_RATIO` times the compressed bytes taken (once `INFLATE_RATIO_AFTER` bytes
    came out) is no SSE stream but a bomb: `CompressionRatioExceeded`.

    "deflate" is meant to be zlib-wrapped (RFC 9110) but servers also send raw deflate;
    the first bytes decide which.
    """

    __slots__ = ("_decoder", "_raw_fallback", "_tail", "inflated", "taken")

    def __init__(self, encoding: bytes) -> None:
        gzip = encoding in (b"gzip", b"x-gzip")
        self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        self._raw_fallback = not gzip
        self._tail = b""  # input zlib has not taken yet (it stopped at a piece's bound)
        self.taken = 0  # compressed bytes zlib has taken
        self.inflated = 0  # bytes handed out

    def decompress(self, data: bytes) -> bytes:
        """The first piece of what `data` inflates to (`more` hands out the rest; any of the
        last chunk's input not taken yet goes first)."""
        if self._tail:
            data = self._tail + data
        try:
            out = self._decoder.decompress(data, INFLATE_STEP)
        except zlib.error as exc:
            if not self._raw_fallback:
                raise _corrupt(exc) from exc
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            try:
                out = self._decoder.decompress(data, INFLATE_STEP)
            except zlib.error as exc:
                raise _corrupt(exc) from exc
        self._raw_fallback = False
        return self._counted(data, out)

    def more(self) -> bytes:
        """The next piece of the input taken so far; b"" once it is all out. A piece shorter
        than the bound means zlib wants more input (none is pending inside it then)."""
        data = self._tail
        try:
            out = self._decoder.decompress(data, INFLATE_STEP)
        except zlib.error as exc:
            raise _corrupt(exc) from exc
        return self._counted(data, out)

    def flush(self) -> bytes:
        """What is left at the body's end: nothing once `more` gave b"" (zlib holds no
        output then), so this stays within the bound too."""
        try:
            return self._decoder.flush()
        except zlib.error as exc:
            raise _corrupt(exc) from exc

    def _counted(self, data: bytes, out: bytes) -> bytes:
        tail = self._tail = self._decoder.unconsumed_tail
        self.taken += len(data) - len(tail)
        self.inflated = inflated = self.inflated + len(out)
        if inflated > INFLATE_RATIO_AFTER and inflated > INFLATE_MAX_RATIO * self.taken:
            raise CompressionRatioExceeded(
                f"the upstream's compressed body inflates past {INFLATE_MAX_RATIO} times its"
                f" size ({inflated} bytes from {self.taken}): refused as a compression bomb"
            )
        return out


def _corrupt(exc: zlib.error) -> UpstreamProtocolError:
    return UpstreamProtocolError(f"the upstream's compressed body is invalid: {exc}")


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
