"""Coverage-guided fuzzing of the SSE scanner with atheris (run in a subprocess by a test).

`python tests/support/fuzz/sse_atheris.py -runs=N` feeds atheris' byte strings to the scanner in two
pieces split where the input says, and checks the rules the scanner lives by: any split
gives the same events, line state and truncation count as feeding the whole, the O(1)
`advance` agrees with the scanner's state, and nothing raises.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from middleware.sse import LineState, SSEScanner, advance


def check(data: bytes) -> None:
    if not data:
        return
    cut = data[0] % (len(data) + 1)
    body = data[1:]
    cut = min(cut, len(body))
    whole = SSEScanner(max_line=64)
    expected = whole.feed(body)
    split = SSEScanner(max_line=64)
    got = split.feed(body[:cut]) + split.feed(body[cut:])
    assert got == expected, (body, cut)
    assert split.state == whole.state
    assert split.truncated == whole.truncated
    assert advance(advance(LineState.EVENT, body[:cut]), body[cut:]) == whole.state


if __name__ == "__main__":
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()
