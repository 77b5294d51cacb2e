"""The event stamper: the `relay.Edit` that gives every SSE event the id `<stream-id>:<n>`
and hands each whole event, so stamped, to the stream's log in the store.

Rules (SSE, as the WHATWG parser reads it):

- an *event* is a block of lines ended by a blank line with at least one field line in it;
  comment lines (`:` first) are not events, and a block of comments only is not counted;
- an upstream `id:` line is replaced in place by ours (same line, same place), so the bytes
  and line boundaries around it are unchanged; an event without one gets `id: <sid>:<n>` as
  its last line, just before the blank line that ends it;
- nothing is held back: a chunk's bytes go out when they come. The one case this cannot
  decide — a line whose first bytes `i`/`id` end a chunk — passes through as it is, and our
  id line at the event's end still wins (the last `id` of an event is the one that counts).

The usual chunk (whole one-line `data:` events at an event boundary, LF only) takes a fast
path with no per-line loop. `undo()` restores the state from before the last call and takes
back the events that call handed to the log: `send_nowait`'s server refused the bytes.

An event is held until its blank line to be logged whole, so it is held only up to
`max_event` bytes (the log's `max_bytes`, `--resume-max-bytes`): past that its bytes still go
to the reader as they come, unchanged and with their id, but the held part is dropped and the
log gets `store.LOST` in the event's place. The stream keeps its numbering; a reader resuming
from before that event ends with a terminal `resume_gap` error event when it comes to it
(it cannot be given a whole stream, and is never given one with a hole), and a reader
resuming from it or after it reads on as usual. So one event of any size costs the resume
side at most `max_event` bytes, where it took the event twice over (its parts, then joined).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from middleware.resume.store import LOST

if TYPE_CHECKING:
    from middleware.relaycore import Edit

CR, LF = 13, 10
# The state `undo` goes back to: n, the line flags, the parts list and how long it was; or,
# after a fast path's call, how many events it stamped (only n moved).
_Saved = tuple[int, bool, bool, bool, bool, bool, bool, bool, int, list[bytes], int] | int


class Log(Protocol):
    """Where the stamped events go (a store's log for one stream)."""

    def append(self, event: bytes) -> None: ...

    def retract(self, count: int) -> None: ...


class Stamper:
    """One stream's stamper; see the module docstring."""

    ends = None  # `Edit.ends`: every chunk is the stamper's (each event gets its id)

    __slots__ = (
        "after_cr",
        "appended",
        "at_start",
        "before",
        "boundary",
        "dropping",
        "fields",
        "first",
        "fmt",
        "held",
        "id_field",
        "id_line",
        "log",
        "lost",
        "max_event",
        "n",
        "parts",
        "replaced",
        "saved",
        "stamped",
        "suffix",
    )

    def __init__(self, stream_id: str, log: Log, max_event: int | None = None) -> None:
        self.log = log
        # The most bytes of one event held to log it whole (None: a log without a bound).
        self.max_event = sys.maxsize if max_event is None else max_event
        self.suffix = b"\nid: " + stream_id.encode() + b":%d\n\n"  # the fast path's event end
        self.id_field = b"id: " + stream_id.encode() + b":%d"  # an upstream id line's new text
        self.id_line = self.id_field + b"\n"
        self.fmt = b"%bid: " + stream_id.encode() + b":%d\n\n"  # a one-line event's end
        self.n = 0  # events so far
        # An edit run on each chunk first (forced usage's hiding: the hidden event takes no
        # id), called by its bound `__call__`, which Python calls without the detour an
        # object's own call takes (a wrapper object holding both edits did that twice a chunk).
        self.before: Edit | None = None
        self.first: Callable[[bytes], bytes] | None = None
        self.boundary = True  # at an event boundary: the fast paths apply
        self.at_start = True  # at the start of a line
        self.after_cr = False  # the last byte was a CR: an LF next ends the same line
        self.dropping = False  # inside an upstream id line (replaced by ours)
        self.fields = False  # the current block has a field line: it is an event
        self.stamped = False  # the current event has its id already
        self.replaced = False  # ... from an upstream id line replaced (n+1 not counted yet)
        self.parts: list[bytes] = []  # the current event's output so far
        self.held = 0  # ... its bytes
        self.lost = False  # the current event outgrew `max_event`: its parts are dropped
        self.appended = 0  # events handed to the log by the last call (the general case)
        self.saved: _Saved = 0  # the state before the last call, for `undo`

    @property
    def events(self) -> int:
        return self.n

    @property
    def at_boundary(self) -> bool:
        return self.boundary

    def after(self, edit: Edit) -> None:
        """Run `edit` on each chunk first, and undo it with the stamp's undo."""
        self.before, self.first = edit, edit.__call__

    def __call__(self, body: bytes) -> bytes:
        if self.first is not None:
            body = self.first(body)
        n = self.n
        if self.boundary and CR not in body:
            end = len(body) - 2
            if (
                end > 0
                and body.find(b"\n") == end
                and body[-1] == LF
                and not body.startswith((b":", b"id"))
            ):  # the usual chunk: one one-line event
                self.n = n = n + 1
                self.saved = 1
                out: bytes = self.fmt % (body[:-1], n)
                self.log.append(out if len(out) <= self.max_event else LOST)
                return out
            if (
                body.endswith(b"\n\n")
                and body.find(b"\n\n\n") < 0  # `find`: `in` tries an int needle first
                and not body.startswith((b":", b"id", b"\n"))
                and body.find(b"\nid") < 0
                and body.find(b"\n:") < 0
            ):  # whole events, each with a field line first and no id of its own
                events = body[:-2].split(b"\n\n")
                suffix, log, most = self.suffix, self.log, self.max_event
                pieces = []
                for event in events:
                    n += 1
                    stamped = event + suffix % n
                    pieces.append(stamped)
                    log.append(stamped if len(stamped) <= most else LOST)
                self.n = n
                self.saved = len(events)
                return b"".join(pieces)
        # The parts list itself: a call that ends the event or drops its parts starts a new
        # list, and leaves this one as it was for `undo`.
        parts = self.parts
        self.saved = (
            self.n,
            self.at_start,
            self.after_cr,
            self.dropping,
            self.fields,
            self.stamped,
            self.replaced,
            self.lost,
            self.held,
            parts,
            len(parts),
        )
        self.appended = 0
        out = self._lines(body)
        self._at_boundary()
        return out

    def undo(self) -> None:
        if self.before is not None:
            self.before.undo()
        saved, self.saved = self.saved, 0
        if isinstance(saved, int):  # a fast path's call: only n moved
            self.n -= saved
            if saved:
                self.log.retract(saved)
            return
        (
            self.n,
            self.at_start,
            self.after_cr,
            self.dropping,
            self.fields,
            self.stamped,
            self.replaced,
            self.lost,
            self.held,
            parts,
            kept,
        ) = saved
        del parts[kept:]
        self.parts = parts
        self._at_boundary()
        if self.appended:
            self.log.retract(self.appended)
            self.appended = 0

    def _lines(self, body: bytes) -> bytes:
        """The general case, one line at a time (CR, LF, CRLF; lines split across chunks)."""
        out: list[bytes] = []
        i, size = 0, len(body)
        if self.after_cr and size and body[0] == LF:
            # The LF of a CRLF split across chunks; after a blank line the event is in the
            # log already, ended by its CR (the same line end to a reader).
            if self.parts:
                self._emit(out, b"\n")
            else:
                out.append(b"\n")
            i = 1
        self.after_cr = False
        while i < size:
            if self.at_start and body[i] in (CR, LF):  # a blank line: the block ends
                end = i + 2 if body[i] == CR and body[i + 1 : i + 2] == b"\n" else i + 1
                if self.replaced:
                    self.n += 1
                elif self.fields and not self.stamped:
                    self.n += 1
                    self._emit(out, self.id_line % self.n)
                self._emit(out, body[i:end])
                self.after_cr = end == size and body[end - 1] == CR
                self._end_block()
                i = end
                continue
            if self.at_start:
                head = body[i : i + 3]
                if head == b"id:" or (len(head) == 3 and head[:2] == b"id" and head[2] in b"\r\n"):
                    self.dropping = True
                    self.fields = self.stamped = self.replaced = True
                    self._emit(out, self.id_field % (self.n + 1))
                elif body[i] != 0x3A:  # ":" starts a comment
                    self.fields = True
            j = _line_end(body, i)
            if j < 0:  # the line goes on in the next chunk
                if not self.dropping:
                    self._emit(out, body[i:])
                self.at_start = False
                break
            end = j + 2 if body[j] == CR and body[j + 1 : j + 2] == b"\n" else j + 1
            self._emit(out, body[j:end] if self.dropping else body[i:end])
            self.after_cr = end == size and body[end - 1] == CR
            self.dropping = False
            self.at_start = True
            i = end
        return b"".join(out)

    def _at_boundary(self) -> None:
        self.boundary = self.at_start and not self.parts and not self.lost and not self.after_cr

    def _emit(self, out: list[bytes], data: bytes) -> None:
        out.append(data)
        if self.lost:
            return
        self.parts.append(data)
        self.held += len(data)
        if self.held > self.max_event:  # too large to log whole: drop what is held
            self.lost = True
            self.parts, self.held = [], 0

    def _end_block(self) -> None:
        if self.fields:
            self.log.append(LOST if self.lost else b"".join(self.parts))
            self.appended += 1
        self.parts, self.held, self.lost = [], 0, False
        self.fields = self.stamped = self.replaced = False


def _line_end(body: bytes, start: int) -> int:
    lf = body.find(b"\n", start)
    cr = body.find(b"\r", start, lf if lf >= 0 else len(body))
    return cr if cr >= 0 else lf
