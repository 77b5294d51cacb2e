"""The per-chunk core of a relay, in Python: `RelayCore`, the fields a relayed chunk reads
and writes, and its methods: `send_nowait`, and `_account` (shared with the relay's `send`),
which hands a chunk to its `Tally` (the token path) or to `_relayed`.

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
Python frame. Telemetry gives the core a `Tally` (None without telemetry: nothing is counted)
and reads it at the stream's end; once it has learned the stream's token chunk (`Tally.frame`),
a chunk that matches it is one whole event and one token, and the tally counts it (the chunk,
its bytes, its time) in place of the subclass's `_relayed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic
from typing import Protocol

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


class Tally:
    """What the token path counts of one stream, for telemetry, which makes it, counts the other
    chunks into it too (`chunks`, `body_bytes`) and reads it at the stream's end. `frame` is
    the stream's learned token chunk while the stream stands at an event boundary, else None;
    each token chunk's time goes to `times` (telemetry's `Gaps.times`), handed to `fold` once
    `kept` are held. Slotted, as the core: the compiled twin reads its fields in place."""

    __slots__ = ("body_bytes", "chunks", "fold", "frame", "kept", "times")

    frame: Frame | None

    def __init__(self, times: list[float], kept: int, fold: Callable[[], object]) -> None:
        self.frame = None
        self.chunks = self.body_bytes = 0
        self.times = times
        self.kept = kept
        self.fold = fold

    def add(self, body: bytes, now: float) -> None:
        """One token chunk of `frame`, given to the server at `now`."""
        self.chunks += 1
        self.body_bytes += len(body)
        times = self.times
        times.append(now)
        if len(times) >= self.kept:
            self.fold()


class RelayCore:
    """A stream's per-chunk state (the rest of it is `relay.Relay`'s); slotted, so that the
    fields a chunk touches sit in the object itself."""

    __slots__ = (
        "edit",
        "first_token_at",
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
        "tally",
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
    tally: Tally | None  # telemetry's (see the module docstring); None: no token path

    def _scan(self, body: bytes, now: float) -> None:
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
        token chunk of the tally's learned `frame` by the idle clock and the tally (a whole
        event, after the first token: the line state and the first token stay as they are),
        any other by `_relayed`."""
        tally = self.tally
        # `tally.frame` read twice, not bound by `:=`: measured faster interpreted.
        if tally is not None and tally.frame is not None and tally.frame.matches(body):
            self.last_chunk = now
            tally.add(body, now)
        else:
            self._relayed(body, now)

    def _relayed(self, body: bytes, now: float) -> None:
        """Account for any other body chunk given to the server: the idle clock, the first
        token, the SSE line state."""
        self.last_chunk = now
        if self.scanner is not None:
            self._scan(body, now)
        elif self.first_token_at is None:
            self.first_token_at = now
        self.line_state = advance(self.line_state, body)
