"""Forced usage, hidden again: a client that did not ask reads the bytes it would have read.

Asked for usage (`middleware.usage`), an OpenAI-style server sends two things it would not
have: a usage-only chunk (`{"id":…,"choices":[],"usage":{…}}`, or with no `choices`) and, on
every other chunk, a top-level `"usage":null` member (vLLM's last, OpenAI's before its
`obfuscation` pad; with `continuous_usage_stats`, vLLM's usage so far). `HideUsage`, the
relay's `Edit` for such a client, takes out exactly those: the usage-only chunk's whole
*block* (every line between the blank line before it and its own: `id:`, `event:`, `retry:`,
comments), and, in a block whose data is one `data:` line holding a JSON object, the
top-level `usage` member (null; continuous: or an object) as the server spaced it, with the
comma joining it to the next member or, if last, to the one before. SSE is read as the
WHATWG parser reads it: LF, CRLF or lone-CR line ends (a CRLF may be split between reads),
`data:` with or without its space, a BOM first. Anything else holding `"usage"` that is not
exactly that (usage beside non-empty choices without continuous, a member twice, a null in
data over several lines, a `{` that does not parse, a block past `HOLD_LIMIT`) goes as it came
and counted (`LEFT_UNCHANGED`: `sidestream.usage.unchanged_chunks`): a client is never sent
a byte it would not have had without sidestream.

Deliberate choices (do not "fix" these):

- Bytes are held, as few as the rule needs: a block until its first `data:` line shows
  whether it is the usage chunk (to its end if it is), and a `data:` line starting `{` until
  its line end. Data not starting `{` (`[DONE]`) goes out as it comes. A block still held when
  the stream ends (no blank line after it) is not sent: no SSE client dispatches it.
- A key is found by its bytes `"usage"`: one spelt with escapes is not looked at.
- At an event boundary, a chunk of whole one-line `data:` events, LF only, takes the compiled
  `hide` (`middleware/_usage.c`) where built; it hands anything else back here (None).
"""

from __future__ import annotations

from typing import Any

from middleware.speedups import usage_scanner
from middleware.usage_examine import DROP, KEEP, MORE, STRIP, UNSURE, examine

HOLD_LIMIT = 1 << 16  # bytes of one block held to decide it, at most: past it, relayed as is
_compiled = usage_scanner  # `_usage.c` where built (`middleware.speedups`)
EMIT, HOLD, GONE = 1, 2, 3  # what becomes of an LF after a CR: where its line went
BOM = b"\xef\xbb\xbf"
LEAD = 64  # a held line's first bytes kept apart, to tell a `data:` line's first value byte


class Tally:
    """Chunks relayed unchanged because their usage could not be taken out exactly."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


LEFT_UNCHANGED = Tally()  # process-wide, read by telemetry at collection


class HideUsage:
    """One stream's edit for a client that did not ask for usage (see the module docstring).

    What it holds is appended to, never rewritten (but for the line just completed), and
    lists are replaced rather than cleared: `undo()` goes back to the state from before the
    last call by truncating, so that neither a call nor its undo costs more with more held
    (a line read a byte at a time stays linear)."""

    ends = None  # `Edit.ends`: every chunk is the edit's (a block may be held across reads)

    __slots__ = (
        "after_cr",
        "block",
        "clean",
        "continuous",
        "counted",
        "data",
        "drop",
        "fast",
        "held",
        "lead",
        "mid_line",
        "partial",
        "saved",
        "started",
        "undecided",
    )

    def __init__(self, continuous: bool = False) -> None:
        self.continuous = continuous
        self.block: list[bytes] = []  # the undecided block's lines so far, held
        self.partial: list[bytes] = []  # its line under way, held, as it came
        self.lead = b""  # that line's first bytes (up to LEAD), to tell what it is
        self.held = 0  # bytes in both
        self.data: list[bytes] = []  # its data lines' values
        self.undecided = True  # the block may yet be the usage chunk (or have `usage` cut)
        self.drop = False  # ... its one data line is the usage chunk
        self.mid_line = False  # a line under way went out already: the rest of it follows
        self.after_cr = 0  # a CR ended the last read: what an LF first in the next joins
        self.started = False  # past the stream's first line (a BOM only counts there)
        self.saved: tuple[Any, ...] | None = None
        self.counted = 0  # chunks the last call counted as left unchanged
        self.clean = True  # at a block's start, nothing held: `_whole` may answer
        # The compiled `hide` where built (it hides no continuous usage): a token's edit is
        # one Python frame and one C call.
        self.fast = None if _compiled is None or continuous else _compiled.hide

    def __call__(self, body: bytes) -> bytes:
        if self.clean:
            fast = self.fast
            out: bytes | None = fast(body) if fast is not None else self._whole(body)
            if out is not None:
                self.saved, self.started = None, True
                return out
        block, partial, data = self.block, self.partial, self.data
        self.saved = (
            block, len(block), block[-1] if block else b"", partial, len(partial), data,
            len(data), self.lead, self.held, self.undecided, self.drop, self.mid_line,
            self.after_cr, self.started,
        )  # fmt: skip
        self.counted = 0
        return self._feed(body)

    def _whole(self, body: bytes) -> bytes | None:
        """What `_feed` makes of a chunk of whole events at a block's start, where that
        needs no state (the compiled `hide`'s twin, for fewer cases): LF only, events
        without usage, or one event of one `data:` line whose usage is cut or dropped; None
        for the rest."""
        if not body.endswith(b"\n\n") or 13 in body:
            return None
        if body.find(b'"usage"') < 0:
            return body
        if not body.startswith(b"data:") or body.find(b"\n") != len(body) - 2:
            return None
        at = 6 if body[5:6] == b" " else 5
        verdict, start, end = examine(body[at:-2], self.continuous)
        if verdict == KEEP:
            return body
        if verdict == STRIP:
            return body[: at + start] + body[at + end :]
        return b"" if verdict == DROP else None

    def undo(self) -> None:
        saved, self.saved = self.saved, None
        if saved is None:
            return  # the last call held nothing and counted nothing
        block, blocks, last, partial, parts, data, datas = saved[:7]
        del block[blocks:], partial[parts:], data[datas:]
        if block:
            block[-1] = last  # a CR's LF may have been added to it
        self.block, self.partial, self.data = block, partial, data
        self.lead, self.held, self.undecided, self.drop, self.mid_line = saved[7:12]
        self.after_cr, self.started = saved[12:]
        LEFT_UNCHANGED.value -= self.counted
        self.counted = 0
        self._settle()

    def _settle(self) -> None:
        self.clean = self.undecided and not (
            self.block or self.partial or self.mid_line or self.after_cr
        )

    def _feed(self, body: bytes) -> bytes:
        out: list[bytes] = []
        i, n = 0, len(body)
        if self.after_cr:
            fate, self.after_cr = self.after_cr, 0
            if body[:1] == b"\n":  # the LF of a CRLF: it goes where its line went
                i = 1
                if fate == EMIT:
                    out.append(b"\n")
                elif fate == HOLD:  # the CR ended a held line: so does the LF
                    self.block[-1] += b"\n"
                    self.held += 1
        cr = 13 in body
        while i < n:
            j = body.find(b"\n", i)
            if cr:
                k = body.find(b"\r", i, n if j < 0 else j)
                if k >= 0:
                    j = k
            if j < 0:
                self._partial(body[i:], out)
                break
            end = j + 1
            if body[j] == 13 and end < n and body[end] == 10:
                end += 1
            fate = self._line(body[i:end], j - i, out)
            if end == n and body[j] == 13:
                self.after_cr = fate
            i = end
        self._settle()
        return b"".join(out)

    def _line(self, piece: bytes, length: int, out: list[bytes]) -> int:
        """One line's end (its content's last `length` bytes and its line end): where it
        went, EMIT, HOLD or GONE."""
        if self.mid_line:
            self.mid_line = False
            out.append(piece)
            return EMIT
        line, content = piece, piece[:length]
        if self.partial:
            head = b"".join(self.partial)
            line, content = head + piece, head + content
            self.partial, self.lead = [], b""
        if not self.started:
            self.started = True
            content = content.removeprefix(BOM)
        if not self.undecided:
            out.append(line)
            if not content:
                self._reset()
            return EMIT
        if not content:  # a blank line: the block ends
            return self._end(line, out)
        self.block.append(line)
        self.held += len(piece)  # the partial before it was counted already
        if content == b"data" or content.startswith(b"data:"):
            value = content[6:] if content[5:6] == b" " else content[5:]
            self.data.append(value)
            if len(self.data) > 1:
                self.drop = False  # data over several lines: decided at the block's end
            else:
                verdict, start, end = examine(value, self.continuous)
                self.drop = verdict == DROP
                if verdict == STRIP:
                    at = len(line) - len(piece) + length - len(value)  # the value's place
                    self.block[-1] = line[: at + start] + line[at + end :]
                self._count(verdict == UNSURE)
                if verdict not in (MORE, DROP):
                    self._release(out)
                    return EMIT
        if self.held > HOLD_LIMIT:
            self._count(True)
            self._release(out)
            return EMIT
        return HOLD

    def _end(self, line: bytes, out: list[bytes]) -> int:
        """The blank line that ends an undecided block: the block goes whole (GONE) if its
        data is the usage chunk, else out as it came (EMIT), counted if it holds usage."""
        data = self.data
        if len(data) > 1 and examine(b"\n".join(data), self.continuous)[0] == DROP:
            self.drop = True
        fate = GONE if self.drop else EMIT
        if not self.drop:
            self._count(any(d.find(b'"usage"') >= 0 for d in data))
            out.extend(self.block)
            out.append(line)
        self._reset()
        return fate

    def _partial(self, rest: bytes, out: list[bytes]) -> None:
        """The start of a line whose end is still to come."""
        if self.mid_line or not self.undecided:
            out.append(rest)
            self.mid_line = True
            return
        self.partial.append(rest)
        self.held += len(rest)
        lead = self.lead
        if len(lead) < LEAD:
            lead = self.lead = lead + rest[: LEAD - len(lead)]
        line = lead if self.started else lead.removeprefix(BOM)
        if not self.data and line.startswith(b"data:"):
            head = (line[6:] if line[5:6] == b" " else line[5:]).lstrip(b" \t")
            if head and head[:1] != b"{":  # no object: neither the usage chunk nor one to cut
                self._release(out)
                return
        if self.held > HOLD_LIMIT:
            self._count(True)
            self._release(out)

    def _release(self, out: list[bytes]) -> None:
        """The block is the server's: what is held goes out, and the rest of it as it comes."""
        out.extend(self.block)
        if self.partial:
            out.extend(self.partial)
            self.mid_line = True
        self.block, self.partial, self.lead, self.held = [], [], b"", 0
        self.undecided = self.drop = False
        self.started = True

    def _reset(self) -> None:
        self.block, self.partial, self.lead, self.held, self.data = [], [], b"", 0, []
        self.undecided, self.drop = True, False

    def _count(self, counts: bool) -> None:
        if counts:
            self.counted += 1
            LEFT_UNCHANGED.value += 1
