"""What a chunk's data says of the usage in it (`examine`), for `usage_hide.HideUsage`.

The data of one SSE block (its `data:` lines' values) is looked at as JSON only where it
holds the bytes `"usage"`, and only at the top level: a member of the top-level object,
found by walking its members with the json module's scanner (`walked`), with where it
starts and ends in the bytes so that exactly it (and one comma) can be cut out. The usual
chunk (`usage` its last member) is answered by one parse of the whole instead (`_last`),
with the walk's answer (tests/unit/test_usage_hide.py checks the two agree).
"""

from __future__ import annotations

import json
import json.scanner
import re
from typing import Any

KEEP, MORE, DROP, STRIP, UNSURE = range(5)  # the verdicts (`examine`)
_BLANKS = b" \t\n\r"  # JSON's whitespace
# `usage` as the last member, null or a flat object: of the top level, where the JSON is one
# object (whose closing brace follows it).
_LAST = re.compile(rb'"usage"[ \t\n\r]*:[ \t\n\r]*(?:null|\{[^{}]*\})(?=[ \t\n\r]*\}[ \t\n\r]*\Z)')
_ESCAPED_ASCII = re.compile(rb"\\u00[2-7][0-9a-fA-F]")  # a key may be spelt otherwise
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _skip(text: str, at: int) -> int:
    """Where the first character at or after `at` that is not JSON's whitespace is."""
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def members(text: str) -> list[tuple[str, int, int, Any]] | None:
    """The top-level members of `text`, one JSON object with blanks around it: each member's
    key, where it starts, where its value ends, and the value; None for anything else."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        return None
    found: list[tuple[str, int, int, Any]] = []
    i = _skip(text, i + 1)
    try:
        while text[i : i + 1] != "}":  # at a member's key (or, with none yet, the brace)
            if text[i : i + 1] != '"':
                return None
            key, j = _SCAN(text, i)
            j = _skip(text, j)
            if text[j : j + 1] != ":":
                return None
            value, end = _SCAN(text, _skip(text, j + 1))
            found.append((key, i, end, value))
            i = _skip(text, end)
            if text[i : i + 1] == ",":
                i = _skip(text, i + 1)
                if text[i : i + 1] != '"':
                    return None  # a comma before the brace
            elif text[i : i + 1] != "}":
                return None
    except (StopIteration, ValueError, RecursionError):
        return None
    return found if _skip(text, i + 1) == len(text) else None


def examine(data: bytes, continuous: bool) -> tuple[int, int, int]:
    """What a block's data (so far) says: KEEP (the server's as it is), MORE (a `{` that is
    not a whole object yet: wait for the block's end), DROP (the usage-only chunk), STRIP
    (cut out [start, end) of `data`) or UNSURE (usage not ours to take out exactly)."""
    if data.find(b'"usage"') < 0:
        if data.lstrip(_BLANKS)[:1] != b"{" or data.rstrip(_BLANKS)[-1:] == b"}":
            return KEEP, 0, 0
        return MORE, 0, 0
    text = data.decode("latin-1")  # one character a byte: offsets are the bytes'
    return _last(data, text, continuous) or walked(data, text, continuous)


def _last(data: bytes, text: str, continuous: bool) -> tuple[int, int, int] | None:
    """`walked(...)` for the usual chunk, `usage` its last member (one parse of the whole
    instead of a walk); None where that is not sure."""
    at = data.find(b'"usage"')
    last = _LAST.match(data, at) if data.find(b'"usage"', at + 1) < 0 else None
    comma = len(data[:at].rstrip(_BLANKS)) - 1
    if last is None or comma < 1 or data[comma] != 44 or data.count(b'"choices"') > 1:
        return None
    if _ESCAPED_ASCII.search(data) is not None:
        return None  # a key may be `usage` or `choices` spelt otherwise
    try:
        whole, end = _SCAN(text, _skip(text, 0))
    except (StopIteration, ValueError, RecursionError):
        return None
    if not isinstance(whole, dict) or _skip(text, end) != len(text):
        return None
    usage, choices = whole["usage"], whole.get("choices", [])
    if usage is None or (continuous and isinstance(usage, dict) and choices != []):
        return STRIP, len(data[:comma].rstrip(_BLANKS)), last.end()
    return None


def walked(data: bytes, text: str, continuous: bool) -> tuple[int, int, int]:
    """`examine` by walking the top-level members of `text` (`data`, one character a byte)."""
    found = members(text)
    if found is None:
        return (MORE if data.lstrip(_BLANKS)[:1] == b"{" else KEEP), 0, 0
    keys = [member[0] for member in found]
    if "usage" not in keys:
        return KEEP, 0, 0
    if keys.count("usage") > 1 or keys.count("choices") > 1:
        return UNSURE, 0, 0
    at = keys.index("usage")
    usage = found[at][3]
    if isinstance(usage, dict) and ("choices" not in keys or found[keys.index("choices")][3] == []):
        return DROP, 0, 0
    if usage is None or (continuous and isinstance(usage, dict)):
        if at + 1 < len(found):  # up to the next member's key, the comma between included
            return STRIP, found[at][1], found[at + 1][1]
        if at:  # the last member: from the end of the value before it
            return STRIP, found[at - 1][2], found[at][2]
        return STRIP, found[at][1], found[at][2]
    return UNSURE, 0, 0
