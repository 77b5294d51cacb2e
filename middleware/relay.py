"""The per-chunk half of a request's cycle: a stream's body chunks on their way to the client.

`Relay` holds what a relayed chunk reads and writes, and the methods a chunk runs through:
`send` (the app's ASGI send), `send_nowait` (the `sidestream.send_nowait` extension: written
from the upstream's read callback without waking the request's task), and the accounting
both share, `_account`: telemetry's `tally` for a token chunk of the stream's learned frame,
`_relayed` for any other. All but `send`, and the fields they touch, are its base `RelayCore`
(`relaycore.py`, or its compiled twin: `speedups`). Everything else of the request — its
start, the timer, keep-alives, failures — is `cycle.Cycle`, the one subclass.
"""

from __future__ import annotations

import asyncio
from time import monotonic

from middleware.dialects import Dialect, sniff
from middleware.phases import BODY, DONE, HEADERS, START, Phase, step
from middleware.receiver import Receiver
from middleware.speedups import RelayCore
from middleware.sse import LineState, message_event
from middleware.types import Message, Send, SendNowait

BOM = b"\xef\xbb\xbf"
KEEPALIVE = b": keep-alive\n"
EVENT = LineState.EVENT  # a module global, as the phases (see `phases.START`)


class Relay(RelayCore):
    """A stream's relay state (see the module docstring)."""

    __slots__ = (
        "completed_at",
        "dialect",
        "downstream",
        "inflating",
        "keepalives",
        "receiver",
        "wrote_before_body",
    )

    def __init__(
        self, receiver: Receiver, send: Send, server_nowait: SendNowait | None, now: float
    ) -> None:
        self.receiver = receiver
        self.downstream = send
        # The server's synchronous body write, if it offers one (see `send_nowait`).
        self.server_nowait = server_nowait
        self.phase = START
        self.last_chunk = self.last_write = now
        self.first_token_at = None
        self.sending_since = None
        self.completed_at: float | None = None  # the app handed over its final body message
        self.keepalive = None
        self.keepalives = 0  # written so far
        self.reason = None
        self.wrote_before_body = False  # a keep-alive went out before the first body byte
        self.line_state = EVENT
        self.scanner = None
        self.dialect: Dialect | None = None
        self.inflater = None
        self.inflating = False  # `_inflate` is handing its pieces to `send`
        self.edit = None
        self.tally = None  # telemetry's: none, no token path (`relaycore.Tally`)
        self.slice_bytes = 0  # no bound (resume sets one: `_slices`)

    async def _send_other(self, message: Message) -> None:
        """Everything but a stream's body chunk (the response start, a plain response)."""
        raise NotImplementedError

    def _enter(self, phase: Phase) -> None:
        self.phase = step(self.phase, phase)
        if phase is DONE:
            self.receiver.closed = True

    async def send(self, message: Message) -> None:
        """The app's `send`. A stream's body chunk is relayed here, not in a coroutine helper:
        a coroutine call per chunk is measurable (the accounting, a plain call, is shared
        with `send_nowait`)."""
        phase = self.phase
        if (phase is not BODY and phase is not HEADERS) or message["type"] != "http.response.body":
            await self._send_other(message)
            return
        if self.reason is not None:
            # Stopped already. A server that drops writes to a gone client never suspends in
            # send(), so the pending cancellation could not reach an app that sends in a loop.
            raise asyncio.CancelledError
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if 0 < self.slice_bytes < len(body):
            await self._slices(body, more)
            return
        if self.inflater is not None and not self.inflating:
            await self._inflate(body, more)
            return
        now = monotonic()
        if body:
            if phase is HEADERS:
                self._enter(BODY)
                if self.wrote_before_body and body.startswith(BOM):
                    # A BOM is only a BOM at the start of the stream; a keep-alive went first.
                    body = body[3:]
                    message = {"type": "http.response.body", "body": body, "more_body": more}
            self._account(body, now)
            edit = self.edit
            if edit is not None:  # every chunk: `ends` is for the fast path, where a call counts
                message = {"type": "http.response.body", "body": edit(body), "more_body": more}
        if not more:
            self._enter(DONE)
            self.completed_at = now
        if self.keepalive is not None:
            await asyncio.wait((self.keepalive,))
        self.sending_since = self.last_write = now
        try:
            await self.downstream(message)
        finally:
            self.sending_since = None

    async def _slices(self, body: bytes, more: bool) -> None:
        """A chunk longer than `slice_bytes`, sent on in slices of at most that (cut after a
        line end where the slice holds one), a loop turn between them.

        For streams whose every event costs Python work on its way (resume's ids and store),
        where a fast upstream's read of up to 256 KB of events, taken in at once for each of
        many streams, held the loop for seconds from every other stream. A compressed chunk is
        sliced as it came, and each piece it inflates to again (`_inflate`). While the rest waits,
        `send_nowait` refuses (`sending_since`), so no later chunk overtakes it."""
        size, start, end = self.slice_bytes, 0, len(body)
        while start < end:
            cut = min(start + size, end)
            if cut < end:
                line_end = body.rfind(b"\n", start, cut)
                if line_end > start:
                    cut = line_end + 1
            piece = body[start:cut]
            start = cut
            message = {
                "type": "http.response.body",
                "body": piece,
                "more_body": more or start < end,
            }
            await self.send(message)
            if start < end:
                self.sending_since = monotonic()
                try:
                    await asyncio.sleep(0)
                finally:
                    self.sending_since = None

    async def _inflate(self, body: bytes, more: bool) -> None:
        """A compressed chunk, inflated in pieces of at most `stream_response.INFLATE_STEP`, each
        relayed by `send` as a chunk of its own (`inflating`: taken as it is there); the next
        is made only once the last was written, so a reader that takes nothing leaves the rest
        compressed, however much it inflates to. A loop turn between pieces, as between
        slices: one chunk may inflate to a great many."""
        inflater = self.inflater
        assert inflater is not None
        self.inflating = True
        try:
            piece = inflater.decompress(body)
            while piece:
                await self.send({"type": "http.response.body", "body": piece, "more_body": True})
                piece = inflater.more()
                if piece:
                    await asyncio.sleep(0)
            if not more:
                end = inflater.flush()
                await self.send({"type": "http.response.body", "body": end, "more_body": False})
        finally:
            self.inflating = False

    def _scan(self, body: bytes, now: float) -> None:
        scanner = self.scanner
        assert scanner is not None
        dialect = self.dialect
        parts = scanner.whole_data(body)
        if parts is not None and dialect is not None:
            found = dialect.first_token(parts)  # on the bytes: no event made, mostly
            if found is not None:
                if found:
                    self.first_token_at = now
                    self.scanner = None  # nothing more to learn per chunk
                return
        # Made one at a time: the scan stops at the first token, and makes no event after it.
        events = scanner.feed(body) if parts is None else map(message_event, parts)
        for event in events:
            if dialect is None:
                dialect = self.dialect = sniff(event)
            if dialect.is_token(event):
                self.first_token_at = now
                self.scanner = None  # nothing more to learn per chunk
                return

    async def _write_keepalive(self, now: float) -> None:
        """One `: keep-alive` comment (started by the cycle's timer): while it is written,
        `send` waits for it and `send_nowait` refuses: one writer at a time."""
        self.sending_since = now
        if self.phase is HEADERS:
            self.wrote_before_body = True
        try:
            await self.downstream(
                {"type": "http.response.body", "body": KEEPALIVE, "more_body": True}
            )
            self.keepalives += 1
        finally:
            self.sending_since = None
            self.last_write = now
            self.keepalive = None
