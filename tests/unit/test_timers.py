"""The cycles' shared timer heap (`middleware.timers`), driven with a hand-written loop.

The loop only records what `call_later` is asked for; a test fires the loop timer itself by
running its callback in its context, as a loop would once the delay has passed. Deadlines
are set in the past or the far future, so no test depends on how fast it runs.
"""

from __future__ import annotations

import contextvars
import gc
import weakref
from collections.abc import Callable
from time import monotonic

from hypothesis import given
from hypothesis import strategies as st

from middleware.timers import NOT_ARMED, Timers

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


class Handle:
    def __init__(self, callback: Callable[[], None], context: contextvars.Context) -> None:
        self.callback, self.context, self.cancelled = callback, context, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """`call_later` recorded, never run by itself."""

    def __init__(self) -> None:
        self.handles: list[Handle] = []

    def call_later(
        self, delay: float, callback: Callable[[], None], *, context: contextvars.Context
    ) -> Handle:
        handle = Handle(callback, context)
        self.handles.append(handle)
        return handle

    def fire(self) -> None:
        """Run the live loop timer, as the loop would once it is due."""
        (live,) = [h for h in self.handles if not h.cancelled]
        self.handles.clear()
        live.context.run(live.callback)


class Cycle:
    """A waiter: records when it was called back, and in which context."""

    def __init__(self, name: str, fired: list[tuple[str, str]]) -> None:
        self.name, self.fired = name, fired
        self.timer_due = 0.0
        self.timer_slot = NOT_ARMED
        WHO.set(name)
        self.timer_context = contextvars.copy_context()

    def on_timer(self) -> None:
        self.fired.append((self.name, WHO.get()))


def timers() -> tuple[Timers, Loop]:
    loop = Loop()
    return Timers(loop), loop  # type: ignore[arg-type]


def test_due_cycles_are_called_back_earliest_first_each_in_its_own_context() -> None:
    """One loop timer serves every waiting cycle: when it fires, each cycle whose deadline
    has passed is called back once, earliest deadline first, in the context it armed with;
    a cycle not yet due waits for the next loop timer."""
    fired: list[tuple[str, str]] = []
    heap, loop = timers()
    now = monotonic()
    cycles = {name: Cycle(name, fired) for name in "abcd"}
    heap.arm(cycles["c"], now - 1)
    heap.arm(cycles["a"], now - 3)
    heap.arm(cycles["d"], now + 3600)
    heap.arm(cycles["b"], now - 2)
    loop.fire()
    assert fired == [("a", "a"), ("b", "b"), ("c", "c")]
    assert len(heap) == 1 and cycles["d"].timer_slot == 0
    assert len(loop.handles) == 1  # set again, for d


def test_a_disarmed_or_rearmed_cycle_is_called_back_for_its_last_deadline_only() -> None:
    """Disarming takes a cycle out at once; arming again moves its one deadline: a cycle is
    never called back twice, nor for a deadline it no longer has."""
    fired: list[tuple[str, str]] = []
    heap, loop = timers()
    now = monotonic()
    gone, moved, stays = Cycle("gone", fired), Cycle("moved", fired), Cycle("stays", fired)
    heap.arm(gone, now - 2)
    heap.arm(moved, now - 1)
    heap.arm(stays, now - 1)
    heap.disarm(gone)
    heap.disarm(gone)  # disarming twice is nothing
    heap.arm(moved, now + 3600)
    loop.fire()
    assert fired == [("stays", "stays")]
    assert gone.timer_slot == NOT_ARMED and stays.timer_slot == NOT_ARMED
    assert moved.timer_slot == 0 and len(heap) == 1


def test_a_finished_cycle_is_not_held_by_the_heap() -> None:
    """A disarmed cycle is referenced by nothing of the timers', whatever deadline it had:
    a finished request is not held until its deadline passes."""
    heap, _ = timers()
    cycle = Cycle("x", [])
    heap.arm(cycle, monotonic() + 3600)
    ref = weakref.ref(cycle)
    heap.disarm(cycle)
    del cycle
    gc.collect()
    assert ref() is None and len(heap) == 0


def test_an_earlier_deadline_sets_the_loop_timer_again_a_later_one_does_not() -> None:
    """The loop timer stands for the earliest deadline: arming an earlier one sets it again
    (the old one cancelled); a later one leaves it."""
    heap, loop = timers()
    now = monotonic()
    heap.arm(Cycle("late", []), now + 60)
    heap.arm(Cycle("later", []), now + 120)
    assert len(loop.handles) == 1
    heap.arm(Cycle("soon", []), now + 1)
    assert [h.cancelled for h in loop.handles] == [True, False]


@given(st.lists(st.tuples(st.integers(0, 15), st.integers(-50, 50)), max_size=200))
def test_the_heap_stays_a_heap_whatever_is_armed_and_disarmed(ops: list[tuple[int, int]]) -> None:
    """Any sequence of arms (negative offsets) and disarms (the rest) on sixteen cycles keeps
    every armed cycle at its slot, each parent's deadline no later than its children's, and
    a fire calls back exactly the cycles due, in deadline order."""
    heap, loop = timers()
    fired: list[tuple[str, str]] = []
    cycles = [Cycle(str(i), fired) for i in range(16)]
    base = monotonic() + 1000
    armed: dict[int, float] = {}
    for index, offset in ops:
        if offset >= 0 and offset % 3 == 0:
            heap.disarm(cycles[index])
            armed.pop(index, None)
        else:
            heap.arm(cycles[index], base + offset)
            armed[index] = base + offset
        entries = heap.heap
        assert len(entries) == len(armed)
        for slot, cycle in enumerate(entries):
            assert cycle.timer_slot == slot
            if slot:
                assert entries[(slot - 1) >> 1].timer_due <= cycle.timer_due
    for cycle in heap.heap:  # all due now: the same shift keeps the heap a heap
        cycle.timer_due -= 2000
    if armed:
        loop.fire()
        dues = [armed[int(name)] for name, _ in fired]  # the deadlines as armed
        assert sorted(int(name) for name, _ in fired) == sorted(armed)
        assert dues == sorted(dues)
