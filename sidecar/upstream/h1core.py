"""The per-read core of an HTTP/1.1 upstream connection, in Python: `H1Core.data_received`.

`sidecar/_core.c` holds the same class compiled, line for line (its `H1Core`); when it is
built and `SIDESTREAM_NO_EXTENSIONS` is not set, `sidecar.speedups` hands `h1.H1Connection`
the compiled one. Keep the two in step: a change here is a change there.

A read is fed to httptools' parser (whose body callback appends to `chunks`); the body
bytes go to the `sink` (the guard's `send_nowait`) straight from here when it takes them.
Everything else a read can mean (the head, the end, a waiting reader, flow control) is the
connection's `_after_feed`.

The usual read of a streamed response is one whole chunk (`HEX CRLF payload CRLF`: a token),
arriving where the parser stands between chunks. Such a read is taken here without the
parser (`whole_chunks`): its payloads are what the parser would hand its body callback,
and it would stand where it stands now. Anything else — a chunk cut across reads, the last
chunk, an extension, a malformed size — goes to the parser whole, which then says whether
it stands between chunks again (`chunk_end`, kept by its chunk callbacks, and a read that
ends with the chunk's CRLF).

The response's headers are taken here too (`on_header`, httptools' callback for each).
"""

from __future__ import annotations

import httptools

from middleware.types import SendNowait

PARSE_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade)
MAX_HEAD_BYTES = 65536  # a response head's headers, each counted with its ": " and CRLF
_HEX = b"0123456789abcdefABCDEF"
MAX_SIZE_DIGITS = 8  # a larger chunk goes to the parser


def whole_chunks(data: bytes) -> list[bytes] | None:
    """The payloads of `data` when it is nothing but whole chunks, each `HEX CRLF payload
    CRLF` with a size above zero in at most `MAX_SIZE_DIGITS` hex digits and no extension;
    else None (the parser's to read)."""
    pieces = []
    at, end = 0, len(data)
    while at < end:
        line = data.find(b"\r\n", at, at + MAX_SIZE_DIGITS + 2)
        if line <= at or data[at:line].strip(_HEX):
            return None
        size = int(data[at:line], 16)
        start = line + 2
        stop = start + size
        if size == 0 or data[stop : stop + 2] != b"\r\n":
            return None
        pieces.append(data[start:stop])
        at = stop + 2
    return pieces


class H1Core:
    """What `data_received` reads and writes of a connection; see the module docstring."""

    __slots__ = (
        "_head_bytes",
        "_parser",
        "at_boundary",
        "chunk_end",
        "chunks",
        "complete",
        "headers",
        "received",
        "sink",
    )

    _parser: httptools.HttpResponseParser | None
    headers: list[tuple[bytes, bytes]]  # the response's, as read
    _head_bytes: int  # their size so far
    chunks: list[bytes]  # body bytes parsed and not yet taken
    complete: bool  # the response has ended
    received: bool  # any response byte
    sink: SendNowait | None  # takes body chunks first (Body.push_to)
    at_boundary: bool  # the parser stands between chunks of a chunked body
    chunk_end: bool  # the parser's last event ended a chunk, or a chunked response's head

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools' callback: one response header (per header of every response, so it is
        part of the compiled core: on the way to each stream's first token)."""
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
        self.headers.append((name, value))

    def on_chunk_header(self) -> None:
        """httptools' callback: a chunk's size line is read."""
        self.chunk_end = False

    def on_chunk_complete(self) -> None:
        """httptools' callback: a chunk's payload and its CRLF are read."""
        self.chunk_end = True

    def abort(self) -> None:
        raise NotImplementedError

    def _refuse_head(self) -> None:
        """Stop the parse: the head is over `MAX_HEAD_BYTES` (raises)."""
        raise NotImplementedError

    def _feed_failed(self, exc: Exception) -> None:
        raise NotImplementedError

    def _after_feed(self) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self.complete:  # unasked bytes on an idle connection
            self.abort()
            return
        self.received = True
        pieces = whole_chunks(data) if self.at_boundary else None
        if pieces is not None:
            self.chunks.extend(pieces)  # as the parser would have: see the module docstring
        else:
            try:
                parser.feed_data(data)
            except PARSE_ERRORS as exc:
                self._feed_failed(exc)
                return
            self.at_boundary = self.chunk_end and data.endswith(b"\r\n")
        chunks = self.chunks
        if chunks and self.sink is not None and self.sink(b"".join(chunks)):
            chunks.clear()  # relayed without waking the consumer
            if not self.complete:
                return  # the sink is set after the head: only the end is news to the reader
        self._after_feed()
