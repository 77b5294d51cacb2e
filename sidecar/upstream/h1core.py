"""The per-read core of an HTTP/1.1 upstream connection, in Python: `H1Core.data_received`.

`sidecar/_core.c` holds the same class compiled, line for line (its `H1Core`); when it is
built and `SIDESTREAM_NO_EXTENSIONS` is not set, `sidecar.speedups` hands `h1.H1Connection`
the compiled one. Keep the two in step: a change here is a change there.

A read is fed to httptools' parser (whose body callback appends to `chunks`); the body
bytes go to the `sink` (the guard's `send_nowait`) straight from here when it takes them.
Everything else a read can mean (the head, the end, a waiting reader, flow control) is the
connection's `_after_feed`.
"""

from __future__ import annotations

import httptools

from middleware.types import SendNowait

PARSE_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade)


class H1Core:
    """What `data_received` reads and writes of a connection; see the module docstring."""

    __slots__ = ("_parser", "chunks", "complete", "received", "sink")

    _parser: httptools.HttpResponseParser | None
    chunks: list[bytes]  # body bytes parsed and not yet taken
    complete: bool  # the response has ended
    received: bool  # any response byte
    sink: SendNowait | None  # takes body chunks first (Body.push_to)

    def abort(self) -> None:
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
        try:
            parser.feed_data(data)
        except PARSE_ERRORS as exc:
            self._feed_failed(exc)
            return
        chunks = self.chunks
        if chunks and self.sink is not None and self.sink(b"".join(chunks)):
            chunks.clear()  # relayed without waking the consumer
            if not self.complete:
                return  # the sink is set after the head: only the end is news to the reader
        self._after_feed()
