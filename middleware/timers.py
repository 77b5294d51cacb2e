"""The cycles' timers, many on one loop timer: a heap of the cycles that wait, by deadline.

A request's cycle keeps one timer, armed for the next moment anything may be due
(`deadlines`) and armed again when it fires. A loop timer of its own costs a stream about
half a kilobyte for as long as it waits (uvloop: a handle, a libuv timer, a bound method, a
context copy), and streams mostly wait, thousands at once. Here a waiting cycle costs its
place in one heap per event loop and its deadline; one loop timer stands for the earliest
deadline. When it fires, each cycle due is called back, earliest first, in its own context,
as a timer of its own would have been. A cycle knows its place in the heap, so disarming it
takes it out at once: nothing of a finished request is held until its deadline.

Deliberate: the heap is a list sifted in Python (a few steps per arm or disarm, log2 of the
number waiting); a cycle arms a few times in its life and once per tick, never per chunk.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from time import monotonic
from typing import Protocol

SLACK = 0.002  # seconds the loop timer is set late: uvloop's timers count whole milliseconds
NOT_ARMED = -1


class Waiter(Protocol):
    """What the heap keeps of a cycle: its deadline, its place, the context its callback
    runs in (its request's, as the loop timer it replaces would have captured) and the
    callback."""

    timer_due: float
    timer_slot: int  # its index in the heap, NOT_ARMED while it waits for nothing
    timer_context: contextvars.Context

    def on_timer(self) -> None: ...


class Timers:
    """One event loop's waiting cycles; `for_loop` finds (or makes) it."""

    __slots__ = ("__weakref__", "context", "handle", "heap", "loop", "next_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[Waiter] = []
        self.handle: asyncio.TimerHandle | None = None
        self.next_at = math.inf  # the deadline the loop timer is set for
        self.context = contextvars.Context()  # the loop timer's: each callback runs in its own

    def arm(self, waiter: Waiter, when: float) -> None:
        """Call `waiter.on_timer()` once `when` (monotonic seconds) has passed, instead of
        whenever it was armed for."""
        if waiter.timer_slot != NOT_ARMED:
            self._take(waiter.timer_slot)
        waiter.timer_due = when
        heap = self.heap
        waiter.timer_slot = len(heap)
        heap.append(waiter)
        self._up(waiter.timer_slot)
        if when < self.next_at:
            self._set(when)

    def disarm(self, waiter: Waiter) -> None:
        """No callback for `waiter` (armed or not). The loop timer, if now early, finds
        nothing due when it fires and is set again for what is."""
        if waiter.timer_slot != NOT_ARMED:
            self._take(waiter.timer_slot)

    def __len__(self) -> int:
        return len(self.heap)

    def _set(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.next_at = when
        delay = max(0.0, when - monotonic()) + SLACK
        self.handle = self.loop.call_later(delay, self._fire, context=self.context)

    def _fire(self) -> None:
        self.handle = None
        self.next_at = math.inf
        heap, now, due = self.heap, monotonic(), []
        while heap and heap[0].timer_due <= now:
            due.append(self._take(0))
        if heap:
            self._set(heap[0].timer_due)
        for waiter in due:
            waiter.timer_context.run(waiter.on_timer)

    def _take(self, slot: int) -> Waiter:
        heap = self.heap
        waiter = heap[slot]
        waiter.timer_slot = NOT_ARMED
        last = heap.pop()
        if slot < len(heap):
            heap[slot] = last
            last.timer_slot = slot
            self._up(slot)
            self._down(last.timer_slot)
        return waiter

    def _up(self, slot: int) -> None:
        heap = self.heap
        waiter = heap[slot]
        due = waiter.timer_due
        while slot > 0:
            parent = (slot - 1) >> 1
            above = heap[parent]
            if above.timer_due <= due:
                break
            heap[slot] = above
            above.timer_slot = slot
            slot = parent
        heap[slot] = waiter
        waiter.timer_slot = slot

    def _down(self, slot: int) -> None:
        heap = self.heap
        size = len(heap)
        waiter = heap[slot]
        due = waiter.timer_due
        while True:
            child = 2 * slot + 1
            if child >= size:
                break
            if child + 1 < size and heap[child + 1].timer_due < heap[child].timer_due:
                child += 1
            below = heap[child]
            if below.timer_due >= due:
                break
            heap[slot] = below
            below.timer_slot = slot
            slot = child
        heap[slot] = waiter
        waiter.timer_slot = slot


# One `Timers` per loop while any cycle of that loop holds it (keyed by the loop's id: the
# `Timers` holds its loop, so the id is not reused while the entry lives).
_BY_LOOP: weakref.WeakValueDictionary[int, Timers] = weakref.WeakValueDictionary()


def for_loop(loop: asyncio.AbstractEventLoop) -> Timers:
    """The `Timers` of `loop`; the caller keeps it for as long as it arms timers."""
    timers = _BY_LOOP.get(id(loop))
    if timers is None or timers.loop is not loop:
        timers = _BY_LOOP[id(loop)] = Timers(loop)
    return timers
