"""The traffic protocol's request-head deadlines (`http1.limits.HeadDeadlines`):
every connection's under one loop timer, driven with a hand-written loop whose clock the
test moves and whose timer it fires itself, so no test depends on how fast it runs."""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from sidecar.servers.http1.limits import HeadDeadlines


class Handle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback = when, callback


class Loop:
    """A clock the test sets, and `call_at` recorded, never run by itself."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[Handle] = []
        self.errors: list[dict[str, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(
        self, when: float, callback: Callable[[], None], *, context: contextvars.Context
    ) -> Handle:
        self.handles.append(Handle(when, callback))
        return self.handles[-1]

    def call_exception_handler(self, context: dict[str, object]) -> None:
        self.errors.append(context)

    def run_until(self, now: float) -> None:
        """Move the clock to `now`, firing the loop timer each time it is due by then."""
        while self.handles and self.handles[-1].when <= now:
            handle = self.handles.pop()
            self.now = max(self.now, handle.when)
            handle.callback()
        self.now = now


class Connection:
    def __init__(self, name: str, fired: list[tuple[str, float]], loop: Loop) -> None:
        self.name, self.fired, self.loop = name, fired, loop

    def _head_timed_out(self) -> None:
        self.fired.append((self.name, self.loop.now))


def test_one_loop_timer_serves_every_connection_in_the_order_their_deadlines_fall() -> None:
    """Three connections set a deadline a second apart: one loop timer, for the first. A
    cleared deadline never fires; one set again moves to its new time; each fires at its own
    time, and the timer is set again for the next one due (none when none is left)."""
    loop, fired = Loop(), []
    deadlines = HeadDeadlines(loop, 10.0)  # type: ignore[arg-type]
    a, b, c = (Connection(name, fired, loop) for name in "abc")
    for at, conn in enumerate((a, b, c)):
        loop.now = float(at)
        deadlines.arm(conn)
    assert [h.when for h in loop.handles] == [10.0]
    deadlines.disarm(b)
    loop.now = 3.0
    deadlines.arm(a)  # a new head on a kept-alive connection: due at 13 now
    loop.run_until(12.5)
    assert fired == [("c", 12.0)] and [h.when for h in loop.handles] == [13.0]
    loop.run_until(20.0)
    assert fired == [("c", 12.0), ("a", 13.0)] and loop.handles == [] and not deadlines.pending


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), st.booleans(), st.integers(0, 4)),
        max_size=30,
    )
)
def test_each_deadline_fires_once_at_its_last_setting_unless_cleared(
    steps: list[tuple[float, bool, int]],
) -> None:
    """Any sequence of connections setting (True) and clearing (False) their deadlines as
    time goes on: what fires is, at each moment, every connection whose deadline stands and
    has passed, earliest first, each at its own time, and each once: as a loop timer of
    its own per connection would have fired."""
    loop, fired = Loop(), []
    deadlines = HeadDeadlines(loop, 2.0)  # type: ignore[arg-type]
    conns = [Connection(str(i), fired, loop) for i in range(5)]
    standing: dict[str, float] = {}
    expected: list[tuple[str, float]] = []

    def advance(to: float) -> None:
        # Earliest first; at one time, in the order they were set.
        due = sorted(((n, w) for n, w in standing.items() if w <= to), key=lambda nw: nw[1])
        expected.extend(due)
        for name, _ in due:
            del standing[name]
        loop.run_until(to)

    for step, arm, who in steps:
        advance(loop.now + step)
        if arm:
            deadlines.arm(conns[who])
            standing.pop(conns[who].name, None)
            standing[conns[who].name] = loop.now + 2.0
        else:
            deadlines.disarm(conns[who])
            standing.pop(conns[who].name, None)
        assert len(loop.handles) <= 1  # one loop timer at most, whatever the count
    advance(loop.now + 10.0)
    assert fired == expected and not deadlines.pending and loop.handles == []


def test_a_failing_connection_does_not_keep_the_others_deadlines_from_firing() -> None:
    """A connection whose timeout handling raises is reported to the loop's exception
    handler; the connections due with it and after it still time out, each at its time."""
    loop, fired = Loop(), []
    deadlines = HeadDeadlines(loop, 1.0)  # type: ignore[arg-type]

    class Failing(Connection):
        def _head_timed_out(self) -> None:
            raise RuntimeError("broken")

    a, bad, b = (
        Connection("a", fired, loop),
        Failing("bad", fired, loop),
        Connection("b", fired, loop),
    )
    deadlines.arm(a)
    deadlines.arm(bad)
    loop.now = 0.5
    deadlines.arm(b)
    loop.run_until(5.0)
    assert fired == [("a", 1.0), ("b", 1.5)]
    assert [type(e["exception"]) for e in loop.errors] == [RuntimeError]
