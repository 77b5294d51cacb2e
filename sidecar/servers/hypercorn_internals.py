"""Every use of hypercorn's private internals: the bounded HTTP/2 per-stream send buffer.

Checked against hypercorn 0.18.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
installed release's major.minor is one checked and `hypercorn.protocol.h2` still has
`StreamBuffer` and `BUFFER_LOW_WATER`. When it says no, `bound_h2_stream_buffers()` leaves
hypercorn's own buffer in place (the public path) and logs one line. A runtime gate, not a
bound in pyproject, because the unpatched buffer still serves every stream correctly: what
it loses is the pause of the upstream for a slow HTTP/2 client, which a later hypercorn may
well fix itself, and the replacement below relies on the buffer's private fields
(`buffer`, `_paused`, `_is_empty`), which a later release may change.

The patch is applied when the `--http2` listener starts serving, never on import.
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
    return hasattr(hyper_h2, "StreamBuffer") and hasattr(hyper_h2, "BUFFER_LOW_WATER")


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
