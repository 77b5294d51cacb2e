"""The incremental Server-Sent-Events scanner: bytes in, complete events out. No I/O.

It follows the WHATWG HTML "event stream interpretation" algorithm, fed a chunk at a time:
UTF-8 with replacement, one leading BOM ignored (also when split across chunks), CRLF / LF /
CR line terminators (a CR ending one chunk and an LF starting the next are one terminator),
comments, `field: value` with one optional leading space, and dispatch on a blank line.

It sits on the per-chunk hot path, so it works with C-speed bytes operations (`in`,
`replace`, `split`) over the whole chunk and copies nothing but the incomplete trailing line,
which it carries to the next chunk.

Deliberate differences from the spec (do not "fix" these):

- `Event.id` / `Event.retry` are what *this* event's own lines set, else None. The spec's
  last-event-ID buffer persists across events; a caller that wants it keeps the last non-None.
- A line longer than `max_line` bytes keeps only its first `max_line` bytes (the field value
  is cut, possibly mid-character, which then decodes as U+FFFD); `truncated` counts such
  lines. This bounds memory when an upstream never ends a line.
- An incomplete event at end of stream is never emitted: there is no close() that flushes.

`LineState` and `advance()` track, in O(1) per chunk, where the byte stream stands, so a
writer knows when it may insert a line (a keep-alive comment or a terminal event) safely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Event", "LineState", "SSEScanner", "advance"]

_BOM = b"\xef\xbb\xbf"
# Byte membership tests use ints: `13 in chunk` is one memchr, while `b"\r" in chunk` first
# tries the needle as an integer inside CPython, raising and clearing a TypeError (~9x slower).
CR, LF = 13, 10
_TERMINATOR = re.compile(rb"[\r\n]")


@dataclass(slots=True)
class Event:
    """One dispatched event."""

    event: str  # event type; "message" when no (non-empty) `event:` field was given
    data: str  # data lines joined with "\n" (no trailing "\n")
    id: str | None  # value of this event's own `id:` field (last one wins), else None
    retry: int | None  # this event's `retry:` field if it was all ASCII digits, else None


def message_event(data: bytes) -> Event:
    """The event of one whole one-line `data: ` field (`SSEScanner.whole_data`)."""
    return Event("message", data.decode("utf-8", "replace"), None, None)


class LineState(IntEnum):
    """Where the byte stream stands, for writing extra lines into it safely."""

    EVENT = 0  # at an event boundary (start of stream or just after a blank line)
    LINE = 1  # just after a line terminator, an event is pending (no blank line yet)
    MID = 2  # inside a line
    CR_LINE = 3  # a CR just ended a non-blank line; an LF that follows would belong to it
    CR_EVENT = 4  # a CR just ended a blank line (event boundary), LF may follow


_E, _L, _M, _CL, _CE = LineState
# Transition tables indexed by the current state; any other byte goes to MID.
_AFTER_LF = (_E, _E, _L, _L, _E)
_AFTER_CR = (_CE, _CE, _CL, _CE, _CE)


def advance(state: LineState, chunk: bytes) -> LineState:
    """Line state after `chunk`, looking at no more than its last 3 bytes.

    After any byte other than CR/LF the state is MID whatever came before, and every run of
    3 CR/LF bytes ends in the same state from any start, so for a chunk of 3 or more bytes
    running the automaton over its last 3 bytes from MID is exact.
    """
    if chunk.endswith(b"\n\n"):  # the usual end of a chunk: LF then LF is EVENT from anywhere
        return _E
    last = chunk[-1:]
    if last != b"\n" and last != b"\r":
        return state if not last else _M
    if len(chunk) >= 3:
        state = _M
        chunk = chunk[-3:]
    for byte in chunk:
        if byte == 10:
            state = _AFTER_LF[state]
        elif byte == 13:
            state = _AFTER_CR[state]
        else:
            state = _M
    return state


class SSEScanner:
    """Incremental WHATWG event-stream parser; `feed()` returns the events each chunk completes."""

    __slots__ = (
        "_cr",
        "_data",
        "_discard",
        "_event",
        "_id",
        "_parts",
        "_pending",
        "_retry",
        "_start",
        "_state",
        "max_line",
        "truncated",
    )

    def __init__(self, max_line: int = 1 << 20) -> None:
        self.max_line = max_line
        self.truncated = 0  # lines cut because they exceeded max_line bytes
        self._state = _E
        self._parts: list[bytes] = []  # the incomplete last line (at the start: a partial BOM)
        self._pending = 0  # its length in bytes, at most max_line
        self._start = True  # the BOM check is still to do
        self._cr = False  # the last chunk ended in CR: drop one LF that starts the next
        self._discard = False  # the tail is full (max_line): drop bytes up to the terminator
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None

    @property
    def state(self) -> LineState:
        """The line state after all bytes fed so far (the same as `advance` folded over them)."""
        return self._state

    def feed(self, chunk: bytes) -> list[Event]:
        """Scan the next bytes; return the events completed by them (possibly [])."""
        if not chunk:
            return []
        self._state = advance(self._state, chunk)
        if self._start:
            if self._parts:
                chunk = self._parts.pop() + chunk
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._parts, self._pending = [chunk], len(chunk)  # maybe a split BOM: wait
                return []
            self._start = False
            self._pending = 0
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]  # the LF of a CRLF split across chunks
        if self._discard:
            found = _TERMINATOR.search(chunk)
            if found is None:
                return []
            self._discard = False
            chunk = chunk[found.start() :]
        if CR in chunk:  # the carried parts never hold a CR: they are normalised already
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = self._parts
        if LF not in chunk:  # keep the pieces, join them once the line ends: no O(n^2)
            if chunk:
                parts.append(chunk)
                self._pending += len(chunk)
                if self._pending > self.max_line:
                    self._truncate()
            return []
        if parts:
            parts.append(chunk)
            chunk = b"".join(parts)
            parts.clear()
            self._pending = 0
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if tail:
            parts.append(tail)
            self._pending = len(tail)
            if self._pending > self.max_line:
                self._truncate()
        return self._lines(lines)

    def whole_events(self, chunk: bytes) -> list[Event] | None:
        """The events of `chunk` when it is whole one-line `data: ` events arriving at an event
        boundary with nothing carried (the usual LLM chunk), taken without the line-by-line
        scan, exactly as `feed` would take them; else None, and nothing is fed (call `feed`)."""
        parts = self.whole_data(chunk)
        return None if parts is None else list(map(message_event, parts))

    def whole_data(self, chunk: bytes) -> list[bytes] | None:
        """`whole_events`' events as their data, undecoded: for a reader that may stop at
        the first event it wants (the first-token scan), and make no event after it."""
        if (
            self._state is not _E
            or self._parts
            or self._cr
            or self._discard
            or self._data
            or self._event
            or self._id is not None
            or self._retry is not None
            or len(chunk) > self.max_line
            or not chunk.startswith(b"data: ")
            or not chunk.endswith(b"\n\n")
            or CR in chunk
        ):
            return None
        parts = chunk[6:-2].split(b"\n\ndata: ")
        if chunk.count(LF) != 2 * len(parts):  # a line of another field, a multi-line data
            return None
        self._start = False  # a BOM later in the stream is data, as in `feed`
        return parts

    def _truncate(self) -> None:
        """Cut the carried line to max_line bytes and drop the rest of it as it arrives."""
        self._parts = [b"".join(self._parts)[: self.max_line]]
        self._pending = self.max_line
        self.truncated += 1
        self._discard = True

    def _lines(self, lines: list[bytes]) -> list[Event]:
        events: list[Event] = []
        data, event, id_, retry = self._data, self._event, self._id, self._retry
        max_line = self.max_line
        for raw in lines:
            if not raw:  # blank line: dispatch
                if data:
                    events.append(Event(event or "message", "\n".join(data), id_, retry))
                    data = []
                event, id_, retry = "", None, None
                continue
            if len(raw) > max_line:
                raw = raw[:max_line]
                self.truncated += 1
            if raw.startswith(b"data: "):  # the usual line, without building its name
                data.append(raw[6:].decode("utf-8", "replace"))
                continue
            if raw[0] == 58:  # ":" starts a comment
                continue
            name, _, value = raw.decode("utf-8", "replace").partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
            elif name == "id":
                if "\0" not in value:
                    id_ = value
            elif name == "retry" and value.isdigit() and value.isascii():
                retry = int(value)
        self._data, self._event, self._id, self._retry = data, event, id_, retry
        return events
