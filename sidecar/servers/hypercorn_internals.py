"""Every use of hypercorn's private internals: the bounded HTTP/2 per-stream send buffer, and
the idle (header) timer on h2c prior-knowledge connections.

Checked against hypercorn 0.18.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
installed release's major.minor is one checked and `hypercorn.protocol.h2` still has
`StreamBuffer` and `BUFFER_LOW_WATER`. When it says no, `bound_h2_stream_buffers()` leaves
hypercorn's own buffer in place (the public path) and logs one line. A runtime gate, not a
bound in pyproject, because the unpatched buffer still serves every stream correctly: what
it loses is the pause of the upstream for a slow HTTP/2 client, which a later hypercorn may
well fix itself, and the replacement below relies on the buffer's private fields
(`buffer`, `_paused`, `_is_empty`), which a later release may change.

The second patch (`h2c_idle_timer()`): hypercorn's one per-connection timer,
`keep_alive_timeout` (the sidecar's `--header-timeout`), runs while a connection has no
request in progress. A cleartext connection starts on HTTP/1.1; h11 parses the h2c preface
`PRI * HTTP/2.0` as a request, so hypercorn stops the timer ("a request began") and then
switches to HTTP/2 — where nothing restarts it until a stream *ends*. A client that sends
the preface and then a header block it never finishes (or nothing at all) would hold the
connection forever. The patch wraps `ProtocolWrapper.handle`: when it has just switched to
HTTP/2 and no stream is open, it reports the connection idle (`Updated(idle=True)`), which
restarts the timer. Private names: `ProtocolWrapper.handle`, `.protocol`, `.send`;
`H2Protocol.idle`. Without it (gate says no): logged, and h2c prior-knowledge connections
have no header deadline; TLS (ALPN h2) and HTTP/1.1 keep theirs.

The patches are applied when the `--http2` listener starts serving, never on import.
"""

from __future__ import annotations

import importlib.metadata
import logging

logger = logging.getLogger("sidestream")

CHECKED = ("0.18",)  # hypercorn major.minor releases these internals were read in


def installed() -> str:
    """The installed hypercorn's version (hypercorn has no `__version__`)."""
    return importlib.metadata.version("hypercorn")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed hypercorn) one the patch was checked against,
    with the names it replaces still there?"""
    from hypercorn.protocol import h2 as hyper_h2

    version = installed() if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    from hypercorn.protocol import ProtocolWrapper

    return (
        hasattr(hyper_h2, "StreamBuffer")
        and hasattr(hyper_h2, "BUFFER_LOW_WATER")
        and callable(getattr(ProtocolWrapper, "handle", None))
        and isinstance(getattr(hyper_h2.H2Protocol, "idle", None), property)
    )


def bound_h2_stream_buffers() -> bool:
    """Make hypercorn's per-stream HTTP/2 send buffer hold a writer back (idempotent); False
    when the gate says no and hypercorn's own buffer stays (logged).

    hypercorn 0.17-0.18 `StreamBuffer.pop` wakes a writer paused at the high-water mark when
    the chunk it *took* is small, not when what is *left* is. A client that stops opening a
    stream's window gets `pop(0)` for every write, so the app is never held back and the
    buffer grows without bound — the upstream is never paused for a slow HTTP/2 client. The
    replacement wakes the writer once the buffer is under the low-water mark.
    """
    from hypercorn.protocol import h2 as hyper_h2

    if getattr(hyper_h2.StreamBuffer, "sidestream_bounded", False):
        return True
    if not checked():
        logger.warning(
            "hypercorn %s is not a release sidestream was checked against (%s): its HTTP/2 "
            "send buffer is left as is, so a slow HTTP/2 client does not pause its upstream",
            installed(),
            ", ".join(CHECKED),
        )
        return False
    low_water = hyper_h2.BUFFER_LOW_WATER

    class StreamBuffer(hyper_h2.StreamBuffer):
        sidestream_bounded = True

        async def pop(self, max_length: int) -> bytes:
            buffer: bytearray = self.buffer
            data = bytes(buffer[:max_length])
            del buffer[:max_length]
            if len(buffer) < low_water:
                await self._paused.set()
            if not buffer:
                await self._is_empty.set()
            return data

    hyper_h2.StreamBuffer = StreamBuffer  # type: ignore[misc]
    return True


def h2c_idle_timer() -> bool:
    """Restart hypercorn's idle timer when a cleartext connection switches to HTTP/2 with no
    stream open (idempotent); False when the gate says no (logged). See the module docstring."""
    from hypercorn.events import Event, Updated
    from hypercorn.protocol import ProtocolWrapper
    from hypercorn.protocol.h2 import H2Protocol

    if getattr(ProtocolWrapper, "sidestream_h2c_idle", False):
        return True
    if not checked():
        logger.warning(
            "hypercorn %s is not a release sidestream was checked against (%s): an h2c "
            "connection (prior knowledge) gets no --header-timeout",
            installed(),
            ", ".join(CHECKED),
        )
        return False
    handle = ProtocolWrapper.handle

    async def handle_then_report_idle(self: ProtocolWrapper, event: Event) -> None:
        before = self.protocol
        await handle(self, event)
        after = self.protocol
        if after is not before and isinstance(after, H2Protocol) and after.idle:
            await self.send(Updated(idle=True))

    ProtocolWrapper.handle = handle_then_report_idle  # type: ignore[method-assign]
    ProtocolWrapper.sidestream_h2c_idle = True  # type: ignore[attr-defined]
    return True
