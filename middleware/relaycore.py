"""The per-chunk core of a relay, in Python: `RelayCore`, the fields a relayed chunk reads
and writes, and its methods: `send_nowait`, and `_account` (shared with the relay's `send`),
which hands a chunk to `_tally` (the token path) or `_relayed`.

`middleware/_relaycore.c` is the same class compiled, line for line (a C twin of each
method, in the same order, with the Python lines as comments beside the C): when it is built
and `SIDESTREAM_NO_EXTENSIONS` is not set, `middleware.speedups` hands `relay.Relay` the
compiled one. Both run the same tests (`make test` runs the suite once with each). Keep the
two in step: a change here is a change there.

Why compiled: a paced stream's token is a few hundred bytes that arrive 20 ms after this
stream's last one and after 49 other streams' tokens, so each token runs its Python with cold
caches; the interpreter's frames and attribute lookups per token were most of what the
sidecar spent over nginx.

The token path is telemetry's, but lives here so that the compiled core runs it with no
Python frame: once a stream's token chunk is learned (`frame`, set by telemetry's cycle; None
without telemetry), a chunk that matches it is one whole event and one token, and `_tally`
counts it (the chunk, its bytes, its time) in place of the subclass's `_relayed`.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import ClassVar, Protocol

from middleware.errors import Outcome, StreamError
from middleware.frame import Frame
from middleware.phases import BODY, Phase
from middleware.sse import LineState, SSEScanner, advance
from middleware.types import SendNowait


class Edit(Protocol):
    """A change the guard makes to a stream's bytes on their way out (resume's event ids,
    forced usage's hidden chunk). Called with each body chunk in order, it returns the bytes
    to write instead. It holds back no more than the start of an SSE block it has yet to
    decide (forced usage, `usage_hide`), so where the input stands at a line boundary the
    output does too: the line state the relay keeps from the input is safe for a keep-alive,
    and the terminal event goes through the edit (what it holds goes out before it)."""

    @property
    def ends(self) -> frozenset[int] | None:
        """None: every chunk is the edit's. Else the chunks it may change are those that do
        not end an event and those whose fourth-last byte (before the closing blank line) is
        in this set: the relay writes the others without the call, which costs more than the
        rest of a token's relay. Fixed for the edit's life: the compiled core reads it once,
        when the edit is set."""

    def __call__(self, body: bytes) -> bytes: ...

    def undo(self) -> None:
        """Forget the last call: its output was not written (the chunk comes again)."""


class Decoder(Protocol):
    """A compressed body's decoder (`stream_response.Inflater`). Declared here, not imported: the
    dialects, which `stream_response` imports, take `Frame` from `speedups`, which imports this."""

    def decompress(self, data: bytes) -> bytes:
        """The first bounded piece of what `data` inflates to."""

    def more(self) -> bytes:
        """The next piece, b"" once the input taken so far is all out."""

    def flush(self) -> bytes: ...


class RelayCore:
    """A stream's per-chunk state (the rest of it is `relay.Relay`'s); slotted, so that the
    fields a chunk touches sit in the object itself."""

    __slots__ = (
        "body_bytes",
        "chunks",
        "edit",
        "first_token_at",
        "frame",
        "inflater",
        "keepalive",
        "last_chunk",
        "last_write",
        "line_state",
        "phase",
        "reason",
        "scanner",
        "sending_since",
        "server_nowait",
        "slice_bytes",
        "times",
    )

    phase: Phase
    reason: StreamError | Outcome | None  # why the guard stopped the app
    sending_since: float | None  # a write to the client under way since
    keepalive: asyncio.Task[None] | None  # a keep-alive being written
    inflater: Decoder | None
    server_nowait: SendNowait | None  # the server's synchronous body write, if offered
    slice_bytes: int  # 0, or a longer chunk is taken in slices (`relay.Relay._slices`)
    edit: Edit | None  # what the guard changes in the stream's bytes, if anything
    scanner: SSEScanner | None  # until the first token
    first_token_at: float | None
    line_state: LineState
    last_chunk: float  # the last body chunk relayed
    last_write: float  # the last bytes handed to the server, keep-alives too
    # The token path (see the module docstring): the stream's learned token chunk while the
    # stream stands at an event boundary, else None; the chunks and bytes relayed (by
    # `_tally`, and by a subclass's `_relayed` for the others); the token chunks' times
    # (telemetry's `Gaps.times`), handed to `_fold` once they are `times_kept`.
    frame: Frame | None
    chunks: int
    body_bytes: int
    times: list[float]
    times_kept: ClassVar[int]

    def _scan(self, body: bytes, now: float) -> None:
        raise NotImplementedError

    def _fold(self) -> None:
        raise NotImplementedError

    def send_nowait(self, body: bytes) -> bool:
        """The `SEND_NOWAIT` extension: relay one more stream chunk now, or refuse (False)
        and let the app `send` it. Refused whenever `send` would do more than write: before
        the first body byte (BOM), while a `send` or a keep-alive is under way (its bytes
        go first), with an inflater, once stopped, a chunk longer than `slice_bytes` (taken
        in slices by `send`), and whenever the server itself refuses (flow control)."""
        if (
            self.phase is not BODY
            or self.reason is not None
            or self.sending_since is not None
            or self.keepalive is not None
            or self.inflater is not None
            or self.server_nowait is None
            or 0 < self.slice_bytes < len(body)
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
        self._account(body, now)
        return True

    def _account(self, body: bytes, now: float) -> None:
        """Account for a body chunk given to the server (by `send` or `send_nowait`): a
        token chunk of the stream's learned `frame` by `_tally`, any other by `_relayed`."""
        frame = self.frame
        if frame is not None and frame.matches(body):
            self._tally(body, now)
        else:
            self._relayed(body, now)

    def _tally(self, body: bytes, now: float) -> None:
        """Account for a chunk that is one token of the stream's `frame`: a whole event,
        after the first token, so the line state and the first token stay as they are; the
        chunk, its bytes, the idle clock, its time."""
        self.chunks += 1
        self.body_bytes += len(body)
        self.last_chunk = now
        times = self.times
        times.append(now)
        if len(times) >= self.times_kept:
            self._fold()

    def _relayed(self, body: bytes, now: float) -> None:
        """Account for any other body chunk given to the server: the idle clock, the first
        token, the SSE line state."""
        self.last_chunk = now
        if self.scanner is not None:
            self._scan(body, now)
        elif self.first_token_at is None:
            self.first_token_at = now
        self.line_state = advance(self.line_state, body)
