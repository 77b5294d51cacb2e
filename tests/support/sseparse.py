"""A whole-body reference SSE parser for checking what a client's EventSource would see.

Written straight from the WHATWG text, independent of middleware.sse, so tests that compare
"events with stalls" to "events without" do not trust the code under test.
"""

from __future__ import annotations

import re

_LINES = re.compile(r"\r\n|\r|\n")


def parse(raw: bytes) -> list[tuple[str, str, str]]:
    """(event type, data, last event id) for every dispatched event."""
    text = raw.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = _LINES.split(text)
    lines.pop()  # the text after the last terminator is an incomplete line
    events = []
    event_type, data, last_id = "", "", ""
    for line in lines:
        if line == "":
            if data:
                events.append((event_type or "message", data.removesuffix("\n"), last_id))
            event_type, data = "", ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event_type = value
        elif name == "data":
            data += value + "\n"
        elif name == "id" and "\0" not in value:
            last_id = value
    return events


def comments(raw: bytes) -> list[str]:
    return [line for line in _LINES.split(raw.decode("utf-8", "replace")) if line.startswith(":")]
