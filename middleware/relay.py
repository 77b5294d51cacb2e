"""The per-chunk half of a request's cycle: a stream's body chunks on their way to the client.

`Relay` holds what a relayed chunk reads and writes, and the three methods a chunk runs
through: `send` (the app's ASGI send), `send_nowait` (the `sidestream.send_nowait`
extension: written from the upstream's read callback without waking the request's task) and
`_relayed` (the accounting both share). Everything else of the request — its start, the
timer, keep-alives, failures — is `cycle.Cycle`, the one subclass.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Protocol

from middleware.dialects import Dialect, sniff
from middleware.errors import Outcome, StreamError
from middleware.framing import Inflater
from middleware.phases import Phase, step
from middleware.receiver import Receiver
from middleware.sse import LineState, SSEScanner, advance
from middleware.types import Message, Send, SendNowait

BOM = b"\xef\xbb\xbf"
KEEPALIVE = b": keep-alive\n"
# The hot path compares against module globals, not class attributes.
HEADERS, BODY, DONE = Phase.HEADERS, Phase.BODY, Phase.DONE


class Edit(Protocol):
    """A change the guard makes to a stream's bytes on their way out (resume's event ids,
    forced usage's hidden chunk). Called with each body chunk in order, it returns the bytes
    to write instead: nothing held back (bytes are forwarded as they come), and the output
    ends at the same kind of line boundary as the input, so the line state the relay keeps
    from the input holds for what was written."""

    @property
    def ends(self) -> frozenset[int] | None:
        """None: every chunk is the edit's. Else the chunks it may change are those that do
        not end an event and those whose fourth-last byte (before the closing blank line) is
        in this set: the relay writes the others without the call, which costs more than the
        rest of a token's relay (forced usage: the usage chunk ends `}}` or `[DONE]`)."""

    def __call__(self, body: bytes) -> bytes: ...

    def undo(self) -> None:
        """Forget the last call: its output was not written (the chunk comes again)."""


class Chain:
    """Two edits, one after the other (forced usage's hiding, then resume's stamping: the
    hidden event takes no id, and a resumed reader never sees it either)."""

    __slots__ = ("ends", "first", "second")

    def __init__(self, first: Edit, second: Edit) -> None:
        self.first, self.second = first, second
        a, b = first.ends, second.ends
        self.ends = None if a is None or b is None else a | b

    def __call__(self, body: bytes) -> bytes:
        return self.second(self.first(body))

    def undo(self) -> None:
        self.first.undo()
        self.second.undo()


def then(edit: Edit | None, more: Edit) -> Edit:
    """`more` after whatever edit a stream has already."""
    return more if edit is None else Chain(edit, more)


class Relay:
    """A stream's relay state (see the module docstring); slotted, so that the fields a
    chunk touches sit in the object itself, fewer cache lines away when the next token of
    this stream comes after many other streams' tokens."""

    __slots__ = (
        "completed_at",
        "dialect",
        "downstream",
        "edit",
        "first_token_at",
        "inflater",
        "keepalive",
        "keepalives",
        "last_chunk",
        "last_write",
        "line_state",
        "phase",
        "reason",
        "receiver",
        "scanner",
        "sending_since",
        "server_nowait",
        "wrote_before_body",
    )

    def __init__(
        self, receiver: Receiver, send: Send, server_nowait: SendNowait | None, now: float
    ) -> None:
        self.receiver = receiver
        self.downstream = send
        # The server's synchronous body write, if it offers one (see `send_nowait`).
        self.server_nowait = server_nowait
        self.phase = Phase.START
        self.last_chunk = self.last_write = now
        self.first_token_at: float | None = None
        self.sending_since: float | None = None  # a write to the client under way since
        self.completed_at: float | None = None  # the app handed over its final body message
        self.keepalive: asyncio.Task[None] | None = None  # a keep-alive being written
        self.keepalives = 0  # written so far
        self.reason: StreamError | Outcome | None = None  # why the guard stopped the app
        self.wrote_before_body = False  # a keep-alive went out before the first body byte
        self.line_state = LineState.EVENT
        self.scanner: SSEScanner | None = None  # until the first token
        self.dialect: Dialect | None = None
        self.inflater: Inflater | None = None
        self.edit: Edit | None = None  # what the guard changes in the stream's bytes, if anything

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
        if self.inflater is not None:
            body = self.inflater.decompress(body) + (b"" if more else self.inflater.flush())
            message = {"type": "http.response.body", "body": body, "more_body": more}
        now = monotonic()
        if body:
            if phase is HEADERS:
                self._enter(BODY)
                if self.wrote_before_body and body.startswith(BOM):
                    # A BOM is only a BOM at the start of the stream; a keep-alive went first.
                    body = body[3:]
                    message = {"type": "http.response.body", "body": body, "more_body": more}
            self._relayed(body, now)
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

    def send_nowait(self, body: bytes) -> bool:
        """The `SEND_NOWAIT` extension: relay one more stream chunk now, or refuse (False)
        and let the app `send` it. Refused whenever `send` would do more than write: before
        the first body byte (BOM), while a `send` or a keep-alive is under way (its bytes
        go first), with an inflater, once stopped, and whenever the server itself refuses
        (flow control)."""
        if (
            self.phase is not BODY
            or self.reason is not None
            or self.sending_since is not None
            or self.keepalive is not None
            or self.inflater is not None
            or self.server_nowait is None
        ):
            return False
        edit = self.edit
        if edit is None or (  # or a chunk the edit leaves as it is, by its `ends` (no call)
            (ends := edit.ends) is not None
            and len(body) > 3
            and body[-1] == 10
            and body[-4] not in ends
        ):
            if not self.server_nowait(body):
                return False
        else:
            out = edit(body)
            if out and not self.server_nowait(out):
                edit.undo()  # refused: the app sends this chunk (maybe with more) by `send`
                return False
        self.last_write = now = monotonic()
        self._relayed(body, now)
        return True

    def _relayed(self, body: bytes, now: float) -> None:
        """Account for a body chunk given to the server (by `send` or `send_nowait`): the
        idle clock, the first token, the SSE line state."""
        self.last_chunk = now
        if self.scanner is not None:
            self._scan(body, now)
        elif self.first_token_at is None:
            self.first_token_at = now
        self.line_state = advance(self.line_state, body)

    def _scan(self, body: bytes, now: float) -> None:
        assert self.scanner is not None
        dialect = self.dialect
        for event in self.scanner.feed(body):
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
