"""A chunked response's parser let go while it stands between chunks: the part of
`sidecar.upstream.h1.H1Connection` that makes its parser, lets it go and stands in for it.

The usual read of a stream (whole chunks: a token) is taken without a parser (`h1core`), and
thousands of open streams would each hold one between reads: its llhttp state and a bound
method per callback, about 0.9 KB. So at a chunk boundary the connection lets it go and stands
in for it (`feed_data`, which `H1Core` calls on whatever `_parser` holds); a read that needs a
parser (a chunk cut across reads, the last chunk, trailers, an extension) gets a new one, made
to stand where the last one stood by a head that says what the real one said. Only a head
that says the same (HTTP/1.1, kept alive, chunked: the connection's `_restful`) lets its
parser go, so the end's answer to "keep alive?" is the first parser's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

# What a resting parser's successor is fed first (`feed_data`): a chunked HTTP/1.1 response
# kept alive, as was the one at rest, with its body just begun.
RESUMED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


class ParserRest:
    """The connection's parser, made, let go and stood in for: a base of `H1Connection`,
    whose fields (declared here for the type checker) it uses."""

    if not TYPE_CHECKING:  # no fields of its own; mypy would read `()` as "none may be set"
        __slots__ = ()

    _parser: httptools.HttpResponseParser | None
    headers: list[tuple[bytes, bytes]]
    _head_bytes: int
    chunks: list[bytes]
    complete: bool
    chunk_end: bool
    on_body: Callable[[bytes], object] | None  # the parser's body callback, called from C

    def _parse(self) -> httptools.HttpResponseParser:
        """A response parser calling this connection's callbacks; its body callback appends
        to `chunks`, called from C, and is held only while a parser is."""
        self.on_body = self.chunks.append
        return httptools.HttpResponseParser(self)

    def _rest(self) -> None:
        """Let the parser go: it stands between chunks of a body that is not over."""
        if not self.complete:
            self._parser = self  # type: ignore[assignment]  # stands in: `feed_data`
            self.on_body = None

    def feed_data(self, data: bytes) -> None:
        """A read while the parser rests that is not whole chunks: a parser again, its state
        as the last one's (between chunks of a chunked body, kept alive), fed the read; let go
        again if it stands between chunks after it."""
        parser = self._parse()
        # Its head's callbacks are not news: its header goes to a list of its own, uncounted,
        # and `on_headers_complete` sees the stand-in and returns.
        headers, head_bytes = self.headers, self._head_bytes
        self.headers, self._head_bytes = [], 0
        parser.feed_data(RESUMED_HEAD)
        self.headers, self._head_bytes = headers, head_bytes
        self._parser = parser
        parser.feed_data(data)
        if self.chunk_end and data.endswith(b"\r\n"):
            self._rest()
