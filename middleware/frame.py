"""A stream's learned token chunk (`Frame`): how the relay's token path counts a token without
parsing it (see `OpenAIChat.count_chunk`, which learns it, and `RelayCore.send_nowait`); and
the first-token check of a chunk of whole events, on their bytes (`first_token`).

`middleware/_frame.c` is the same class and function compiled, line for line (the Python
lines as comments above the C, in the same order); `middleware.speedups` picks them where
they were built and `SIDESTREAM_NO_EXTENSIONS` is not set. Keep the two in step: a change
here is a change there. Compiled, so that the compiled relay core decides a token chunk
with no Python frame, and a stream's first token is found without an event object made.
"""

from __future__ import annotations

from middleware.sse import LF


class Frame:
    """One stream's plain token chunk around its content string (see `count_chunk`):
    `prefix` up to the string's opening quote, `marker` from its closing quote to the end
    of the choices array, `suffix` from that quote to the end of the chunk."""

    __slots__ = ("marker", "prefix", "shortest", "start", "suffix", "tail_len", "varies")

    def __init__(self, prefix: bytes, marker: bytes, suffix: bytes) -> None:
        self.prefix = prefix
        self.start = len(prefix)  # the content string's first byte
        self.marker = marker
        self.suffix = suffix
        self.tail_len = len(suffix) - len(marker)
        # A token chunk holds the prefix, one content byte, the marker and a line end at least.
        self.shortest = self.start + 1 + len(marker) + 2
        self.varies = False  # a token chunk has had a tail other than the learned one

    def matches(self, body: bytes) -> bool:
        """Is `body` one event and one token of this frame: the same prefix, one line (its
        first line end is the event's end: a second event would need another), content not
        empty (so a token, whatever else the delta holds), then the same suffix or the
        marker and a tail of its own (OpenAI's obfuscation pad, the emulator's timestamp)
        with no usage in it. Runs once per relayed token; the caller counts.

        The usual case, the learned suffix, takes the prefix and the suffix off: the content
        is what is left, and it must not start with the closing quote of "" nor hold a line
        end (prefix and suffix hold none but the event's end). `removeprefix` and
        `removesuffix` take one argument where `startswith` and `endswith` parse a tuple of
        them, and their checks add to no more than the rest."""
        if not self.varies:
            rest = body.removeprefix(self.prefix)
            content = rest.removesuffix(self.suffix)
            if rest is not body and content is not rest and content and content[0] != 34:
                return LF not in content
        if not (
            len(body) >= self.shortest  # a read may end anywhere, right after the prefix too
            and body.startswith(self.prefix)
            # One line, then line ends (it ends with a blank line: checked below). What
            # rstrip() takes besides is blank lines and lines of spaces, which make no event;
            # it is also cheaper than the slice body[:-2] (no slice object).
            and LF not in body.rstrip()
            and body[self.start] != 34  # not the closing quote of ""
            and body[-2:] == b"\n\n"  # the end of an event
        ):
            return False
        # A tail of its own after the marker.
        marker = self.marker
        close = len(body) - self.tail_len  # a tail as long as the learned one: the usual
        if body[close - len(marker) : close] != marker:
            close = body.rfind(b"}]") + 2
            if close <= self.start or body[close - len(marker) : close] != marker:
                return False
        tail = body[close:]
        usage = tail.count(b'"usage"')
        if usage and usage != tail.count(b'"usage":null'):
            return False
        self.varies = True  # a tail per chunk: check it first from now on
        return True


def first_token(parts: list[bytes], literal: bytes, keys: tuple[bytes, ...]) -> bool | None:
    """Does one of these events (the data of whole one-line `data:` events, in order: see
    `SSEScanner.whole_data`) carry a token, by `OpenAIChat.is_token`'s rule on their bytes
    (`literal` and `keys` are its `_literal` and `_token_keys`, encoded): True at the first
    that does, False when none does; None when an event needs the rule's regex, which the
    events themselves then decide (`Relay._scan`).

    The same answers as `is_token` on each event's text: the needles are ASCII, which
    decoding (invalid bytes to U+FFFD) neither makes nor breaks, and the rule compares their
    positions only with each other."""
    size = len(literal)
    for data in parts:
        rest = keys
        at = data.find(literal)
        if at >= 0:
            if data[at + size : at + size + 1] not in (b'"', b""):
                return True
            if data.find(keys[0]) == at and data.find(keys[0], at + 1) < 0:
                rest = keys[1:]
        for key in rest:
            if data.find(key) >= 0:
                return None
    return False
