"""A response that is not a stream, read as it passes: its size, whether it is JSON, and, for
a GenAI call's JSON, the facts its body carries (usage, id, model, finish reasons).

Nothing is held back and nothing is changed: each body message is handed to the client as
the app sent it, and this keeps a copy of at most `TAIL` bytes of what went by — the whole
body while it fits, then only its last `TAIL` bytes — parsed once, at the request's end.

- A body that fits (most completions: a few KB) is parsed whole: usage, the response's id
  and model, its finish reasons (`dialects.read_response`).
- A longer one is searched in its last `TAIL` bytes for the last `"usage": {` key written
  with unescaped quotes, which text inside a JSON string can never produce (its quotes are
  escaped), and that object alone is parsed. Servers write `usage` at the end of the object
  (OpenAI, vLLM, llama.cpp, Anthropic), so it is in the tail; the id and model, at the
  start, are not read.
- A compressed body (`Content-Encoding` other than identity) is counted, not read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from middleware.dialects import StreamStats, json_object, read_response

TAIL = 64 * 1024  # bytes of a GenAI call's JSON body kept at most, to find its usage

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_decode = json.JSONDecoder().raw_decode


def is_json(media: bytes) -> bool:
    """`application/json`, or a `+json` type (`application/problem+json`)."""
    return media == b"application/json" or media.endswith(b"+json")


class Answer:
    """One plain response's passage (see the module docstring). `read`: keep the JSON body's
    tail for its usage (a GenAI call); otherwise only its size is counted."""

    __slots__ = ("json", "size", "tail")

    def __init__(self, headers: Iterable[Any], read: bool) -> None:
        media, encoded = b"", False
        for key, value in headers:
            name = bytes(key).lower()
            if name == b"content-type":
                media = bytes(value).split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding":
                encoded = bytes(value).strip().lower() not in (b"", b"identity")
        self.json = is_json(media)
        self.size = 0  # body bytes handed to the client
        self.tail: bytearray | None = bytearray() if read and self.json and not encoded else None

    def took(self, body: bytes) -> None:
        """A body message went to the client."""
        self.size += len(body)
        tail = self.tail
        if tail is None or not body:
            return
        if len(body) >= TAIL:
            tail[:] = body[-TAIL:]
            return
        tail += body
        if len(tail) > TAIL:
            del tail[: len(tail) - TAIL]

    def stats(self) -> StreamStats | None:
        """What the body said, once it has passed; None when it was not read or said nothing
        this could parse."""
        tail = self.tail
        if not tail:
            return None
        stats = StreamStats()
        if self.size <= TAIL:  # the whole body
            obj = json_object(bytes(tail))
            if obj is None:
                return None
            read_response(obj, stats)
            return stats
        at = -1  # the last `"usage": {`: the top level's, written last
        for match in _USAGE.finditer(tail):
            at = match.end() - 1
        if at < 0:
            return None
        text = tail[at:].decode("utf-8", "replace")
        try:
            usage, _ = _decode(text)
        except (ValueError, RecursionError):
            return None
        read_response({"usage": usage}, stats)
        return stats
