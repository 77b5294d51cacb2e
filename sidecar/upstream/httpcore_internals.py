"""Every use of httpcore's private internals: the HTTP/2 connection the h2c pool runs on.

Checked against httpcore 1.0.9 (with h2 4.x). Gate: an upper bound in pyproject
(`httpcore[http2]>=1.0.9,<1.1`), not a runtime fallback. httpcore's public HTTP/2
connection is no safe fallback here: it never resets an abandoned stream, so after enough
cancelled streams the connection refuses new ones (below), and the sidecar relies on
cancellation reaching the upstream. `missing_internals()` lists what a new release moved;
tests/sockets/test_sidecar_internals.py checks it is empty, and tests/test_http2.py checks the
behaviour.

httpcore 1.0.x never resets a stream whose response is closed early (encode/httpcore#1022;
the fix proposed upstream is PR #1098): `_response_closed` frees httpcore's own stream slot
but h2 still counts the stream as open, the upstream keeps generating for nobody, and after
enough cancellations h2 refuses new streams with `Max outbound streams is 100, 100 open`
on a connection that is nearly idle. `Connection` overrides that one step: a stream still
open in h2 is reset with `RST_STREAM(CANCEL)` first — synchronously, so no cancellation can
come between — and the frame is flushed at once. This covers both early exits: a request
abandoned before its response headers (httpcore's own `except` path) and a response closed
mid-body.

Private names used: `httpcore._async.http2.has_body_headers`; on `AsyncHTTP2Connection`,
the attributes `_h2_state`, `_write_lock`, `_network_stream`, `_write_exception`,
`_connection_error` and the methods `_send_request_headers`, `_response_closed`,
`_write_outgoing_data`.

Deliberate surprises (do not "fix"):
- The flush after a reset waits for the write lock at most `FLUSH_TIMEOUT`: the lock may
  be held by a stream blocked on a full socket. Past that the frame stays queued in h2 and
  leaves with the next write; the stream counts are already right either way.
- Each stream's receive window is the pool's `stream_window`, not httpcore's 16 MiB:
  httpcore acknowledges data only when the stream's reader takes it, so the window is what
  bounds the frames buffered for a stream whose client is slow — and what pauses the
  upstream for that stream alone. The connection window stays large, so one slow stream
  cannot stall the others.
"""

from __future__ import annotations

import anyio
import h2.exceptions
import httpcore
from h2.errors import ErrorCodes
from httpcore._async import http2 as httpcore_http2
from httpcore._async.http2 import has_body_headers

CHECKED = "1.0.9"  # the httpcore release these internals were read in
FLUSH_TIMEOUT = 1.0
_DEFAULT_WINDOW = 65535  # RFC 9113 initial window; httpcore leaves SETTINGS at the default

_METHODS = ("_send_request_headers", "_response_closed", "_write_outgoing_data")
_ATTRIBUTES = (
    "_h2_state",
    "_write_lock",
    "_network_stream",
    "_write_exception",
    "_connection_error",
)


def missing_internals(connection: httpcore.AsyncHTTP2Connection | None = None) -> list[str]:
    """The private names this module uses that the installed httpcore lacks (empty when all
    are there); attributes are looked up on `connection` when one is given."""
    base = httpcore.AsyncHTTP2Connection
    missing = [name for name in _METHODS if not callable(getattr(base, name, None))]
    if not callable(getattr(httpcore_http2, "has_body_headers", None)):
        missing.append("has_body_headers")
    if connection is not None:
        missing += [name for name in _ATTRIBUTES if not hasattr(connection, name)]
    return missing


class Connection(httpcore.AsyncHTTP2Connection):
    """httpcore's HTTP/2 connection, with `RST_STREAM(CANCEL)` for abandoned streams and a
    bounded receive window per stream."""

    def __init__(
        self,
        origin: httpcore.Origin,
        stream: httpcore.AsyncNetworkStream,
        *,
        stream_window: int,
    ) -> None:
        super().__init__(origin, stream)
        self.stream_window = stream_window
        self.resets_sent = 0

    @property
    def open_streams(self) -> int:
        """Streams h2 counts as open towards the upstream (what `Max outbound streams` checks)."""
        return int(self._h2_state.open_outbound_streams)

    async def _send_request_headers(self, request: httpcore.Request, stream_id: int) -> None:
        # httpcore's version, with the stream window raised to `stream_window` (not 16 MiB).
        end_stream = not has_body_headers(request)
        authority = next(v for k, v in request.headers if k.lower() == b"host")
        headers = [
            (b":method", request.method),
            (b":authority", authority),
            (b":scheme", request.url.scheme),
            (b":path", request.url.target),
        ] + [
            (k.lower(), v)
            for k, v in request.headers
            if k.lower() not in (b"host", b"transfer-encoding")
        ]
        self._h2_state.send_headers(stream_id, headers, end_stream=end_stream)
        if self.stream_window > _DEFAULT_WINDOW:
            increment = self.stream_window - _DEFAULT_WINDOW
            self._h2_state.increment_flow_control_window(increment, stream_id=stream_id)
        await self._write_outgoing_data(request)

    async def _response_closed(self, stream_id: int) -> None:
        reset = self._reset_if_open(stream_id)
        await super()._response_closed(stream_id)
        if reset:
            await self._flush()

    def _reset_if_open(self, stream_id: int) -> bool:
        """Reset a stream h2 still holds open; True when a RST_STREAM was queued."""
        stream = self._h2_state.streams.get(stream_id)
        if stream is None or stream.closed:
            return False
        try:
            self._h2_state.reset_stream(stream_id, ErrorCodes.CANCEL)
        except h2.exceptions.ProtocolError:  # the connection itself is closed: nothing to end
            return False
        self.resets_sent += 1
        return True

    async def _flush(self) -> None:
        """Write what h2 has queued, now; bounded wait, never raises (cleanup path)."""
        if self._write_exception is not None or self.is_closed():
            return
        with anyio.move_on_after(FLUSH_TIMEOUT):
            async with self._write_lock:
                data = self._h2_state.data_to_send()
                if not data:
                    return
                try:
                    await self._network_stream.write(data)
                except Exception as exc:
                    self._write_exception = exc
                    self._connection_error = True
