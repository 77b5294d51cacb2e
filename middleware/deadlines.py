"""A stream's deadlines, as pure functions of its clocks and its timeouts.

No I/O and no asyncio: the cycle keeps the clocks (monotonic seconds) and one lazy timer;
when the timer fires it asks `expired` what is due and `next_deadline` when to look again.
Three timeouts with three names — first token, idle, total — plus the send timeout for a
client that accepts nothing, and the keep-alive interval, which is not a failure but is due
the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class Expiry(Enum):
    """What a timer found due, in the order it is checked."""

    MAX_DURATION = "max_duration"
    FIRST_TOKEN = "first_token_timeout"
    IDLE = "idle_timeout"
    SEND = "send_timeout"  # the client accepted nothing for send_timeout: a slow client
    KEEPALIVE = "keepalive"  # nothing written for keepalive_interval: write a comment


# The members as module globals, for the functions below (several times a stream) and the
# cycle's timer (see `phases.START`).
MAX_DURATION, FIRST_TOKEN, IDLE = Expiry.MAX_DURATION, Expiry.FIRST_TOKEN, Expiry.IDLE
SEND, KEEPALIVE = Expiry.SEND, Expiry.KEEPALIVE


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds; `None` turns one off."""

    keepalive_interval: float | None = 15.0
    first_token_timeout: float | None = 300.0
    idle_timeout: float | None = 120.0
    max_duration: float | None = 3600.0
    send_timeout: float | None = 60.0
    # How often the timer looks at least (the shortest interval set): chunks move deadlines
    # without touching the timer, so a deadline a chunk started is seen before it can pass.
    tick: float = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "keepalive_interval",
            "first_token_timeout",
            "idle_timeout",
            "max_duration",
            "send_timeout",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(
                    f"{name} must be a positive number of seconds or None, not {value!r}"
                )
        intervals = (self.keepalive_interval, self.idle_timeout, self.send_timeout)
        object.__setattr__(self, "tick", min((t for t in intervals if t is not None), default=60.0))


class Clocks(Protocol):
    """A stream's clocks, as the cycle keeps them (monotonic seconds)."""

    @property
    def started(self) -> float: ...  # the request arrived
    @property
    def first_token_at(self) -> float | None: ...
    @property
    def last_chunk(self) -> float: ...  # the last body chunk relayed
    @property
    def last_write(self) -> float: ...  # the last bytes handed to the server, keep-alives too
    @property
    def sending_since(self) -> float | None: ...  # a write to the client under way since
    @property
    def sse(self) -> bool: ...  # keep-alives apply (an SSE stream)


def deadlines(t: Timeouts, c: Clocks) -> Iterator[tuple[Expiry, float]]:
    """Each deadline in force, as (what, when), in the order they are checked: each rule
    written once, for `expired` and `next_deadline` alike.

    The first-token deadline holds until the first token, the idle one after it. The send
    deadline holds while a write to the client is under way.
    """
    if t.max_duration is not None:
        yield MAX_DURATION, c.started + t.max_duration
    if c.first_token_at is None:
        if t.first_token_timeout is not None:
            yield FIRST_TOKEN, c.started + t.first_token_timeout
    elif t.idle_timeout is not None:
        yield IDLE, c.last_chunk + t.idle_timeout
    if c.sending_since is not None and t.send_timeout is not None:
        yield SEND, c.sending_since + t.send_timeout
    if c.sse and t.keepalive_interval is not None:
        yield KEEPALIVE, c.last_write + t.keepalive_interval


def expired(t: Timeouts, c: Clocks, now: float) -> Expiry | None:
    """The first deadline that has passed at `now`, if any. While a write is under way no
    keep-alive is due: it would wait behind that write."""
    for what, when in deadlines(t, c):
        if now >= when and (what is not KEEPALIVE or c.sending_since is None):
            return what
    return None


def next_deadline(t: Timeouts, c: Clocks, now: float) -> float:
    """The earliest moment something may be due, and no later than `now + t.tick`.

    A keep-alive already due (written or refused at `now`) is next due an interval on.
    """
    earliest = now + t.tick
    for what, when in deadlines(t, c):
        if what is KEEPALIVE and when <= now and t.keepalive_interval is not None:
            when = now + t.keepalive_interval
        earliest = min(earliest, when)
    return earliest
