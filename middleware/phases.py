"""The response phases of one request, as an explicit state (as h11 and hypercorn keep theirs).

```
START ──▶ PLAIN ──────────────▶ DONE      a response passed through untouched
  └─────▶ HEADERS ──▶ BODY ──▶ DONE      a guarded stream
              └───────────────▶ DONE      (ended before its first body byte)
```

`DONE` means the final body message has been handed to the server, by the app or as the
guard's terminal event. An error answered before any headers leaves the phase at START.
"""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    START = "start"  # no response headers yet
    PLAIN = "plain"  # not a stream: passed through untouched, no deadlines
    HEADERS = "headers"  # a stream's headers are sent, no body byte yet
    BODY = "body"  # a stream's body is flowing
    DONE = "done"  # the final body message is with the server

    # Members are singletons compared by identity: hashed by identity too, in C, where
    # Enum's own `__hash__` is a Python call (a step looks a phase up twice).
    __hash__ = object.__hash__


# The members as module globals, for the per-stream code to import: read off its class, a
# member goes through EnumType's `__getattr__` hook (Python 3.11), some 800 instructions.
START, PLAIN, HEADERS, BODY, DONE = Phase.START, Phase.PLAIN, Phase.HEADERS, Phase.BODY, Phase.DONE


class PhaseError(RuntimeError):
    """A transition the state machine does not have (a bug in the guard, not in the app)."""


_NEXT = {
    Phase.START: frozenset({Phase.PLAIN, Phase.HEADERS}),
    Phase.PLAIN: frozenset({Phase.DONE}),
    Phase.HEADERS: frozenset({Phase.BODY, Phase.DONE}),
    Phase.BODY: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


def step(current: Phase, to: Phase) -> Phase:
    """`to`, if the machine goes there from `current`; else PhaseError."""
    if to not in _NEXT[current]:
        raise PhaseError(f"no response phase transition {current.name} -> {to.name}")
    return to
