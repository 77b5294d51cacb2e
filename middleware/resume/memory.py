"""The memory store: one pod's streams, bounded per stream and in total.

Per stream, past `max_bytes` the oldest events go (a resume from before them gets 410), and
an event larger than that is `store.LOST` (a reader that comes to it ends with `resume_gap`);
in total, past `memory` bytes the oldest finished streams are evicted, then the oldest
events of the stream being appended to. A finished stream stays for `ttl` seconds. Readers
wait on one future per stream, made only while someone waits: an append with no reader
waiting costs a deque append and two additions.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import islice

from middleware.resume.ids import same_credentials
from middleware.resume.store import LOST, Limits, ResumeGap, ResumePointGone, StreamNotFound


class MemoryLog:
    """One stream's events in memory (the producer's side and the readers' shared state)."""

    __slots__ = (
        "credentials",
        "end_seen",
        "ended",
        "events",
        "expiry",
        "first",
        "link",
        "max_bytes",
        "origin",
        "outcome",
        "resumes",
        "size",
        "store",
        "stream_id",
        "tail",
        "waiter",
    )

    def __init__(
        self, store: MemoryStore, stream_id: str, credentials: str, origin: str, link: str
    ) -> None:
        self.origin = origin
        self.link = link
        self.store = store
        self.stream_id = stream_id
        self.credentials = credentials
        self.events: deque[bytes] = deque()
        self.first = 1  # the index of events[0]
        self.size = 0
        self.max_bytes = store.limits.max_bytes
        self.tail = b""
        self.ended = False
        self.outcome = ""
        self.resumes = 0
        self.end_seen = False
        self.waiter: asyncio.Future[None] | None = None
        self.expiry: asyncio.TimerHandle | None = None

    def append(self, event: bytes) -> None:
        self.events.append(event)
        size = len(event)
        self.size += size
        store = self.store
        store.used += size
        if self.size > self.max_bytes or store.used > store.memory:
            store.trim(self)
        if self.waiter is not None:
            self._wake()

    def retract(self, count: int) -> None:
        events = self.events
        for _ in range(min(count, len(events))):
            size = len(events.pop())
            self.size -= size
            self.store.used -= size

    def end(self, tail: bytes, outcome: str) -> None:
        if self.ended:
            return
        self.tail, self.outcome, self.ended = tail, outcome, True
        self.store.used += len(tail)
        self.store.finished(self)
        self._wake()

    async def remote_readers(self) -> bool:
        return False

    def drop_oldest(self) -> None:
        size = len(self.events.popleft())
        self.first += 1
        self.size -= size
        self.store.used -= size

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        if self.waiter is None:
            self.waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.waiter)
        except TimeoutError:
            pass


class MemoryReader:
    """One resume request's cursor into a `MemoryLog`."""

    __slots__ = ("cursor", "link", "log", "origin")

    def __init__(self, log: MemoryLog, after: int) -> None:
        self.log = log
        self.origin = log.origin
        self.link = log.link
        self.cursor = after  # the last event this reader has
        log.resumes += 1

    async def read(self, timeout: float | None) -> tuple[list[bytes], bool]:
        log = self.log
        if self.cursor + 1 >= log.first + len(log.events) and not log.ended:
            await log.wait(timeout)
        if self.cursor + 1 < log.first:
            raise ResumePointGone()
        events = list(islice(log.events, self.cursor + 1 - log.first, None))
        if LOST in events:  # the events before it, then (next read) the end of this reader
            events = events[: events.index(LOST)]
            if not events:
                raise ResumeGap()
            self.cursor += len(events)
            return events, False
        self.cursor += len(events)
        if log.ended and self.cursor + 1 >= log.first + len(log.events):
            if log.tail:
                events.append(log.tail)
            log.end_seen = True
            return events, True
        return events, False

    def close(self) -> None:
        pass


class MemoryStore:
    """Streams by id; the finished ones in the order they finished (eviction, expiry)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.memory = self.limits.memory
        self.failures = 0  # nothing here can fail
        self.key = os.urandom(32)
        self.on_stop: Callable[[str], object] | None = None  # one process: never asked
        self.streams: dict[str, MemoryLog] = {}
        self.done: OrderedDict[str, MemoryLog] = OrderedDict()
        self.used = 0

    def open(self, stream_id: str, credentials: str, origin: str = "", link: str = "") -> MemoryLog:
        log = MemoryLog(self, stream_id, credentials, origin, link)
        self.streams[stream_id] = log
        return log

    def _find(self, stream_id: str, credentials: str) -> MemoryLog:
        log = self.streams.get(stream_id)
        if log is None or not same_credentials(log.credentials, credentials):
            raise StreamNotFound()
        return log

    async def attach(self, stream_id: str, after: int, credentials: str) -> MemoryReader:
        log = self._find(stream_id, credentials)
        if after + 1 < log.first:
            raise ResumePointGone()
        return MemoryReader(log, after)

    async def check(self, stream_id: str, credentials: str) -> None:
        self._find(stream_id, credentials)

    async def stop_elsewhere(self, stream_id: str) -> None:
        pass

    def trim(self, log: MemoryLog) -> None:
        limits = self.limits
        while log.size > limits.max_bytes and len(log.events) > 1:
            log.drop_oldest()
        while self.used > limits.memory and self.done:
            self.evict(next(iter(self.done)))
        while self.used > limits.memory and len(log.events) > 1:
            log.drop_oldest()

    def finished(self, log: MemoryLog) -> None:
        self.done[log.stream_id] = log
        log.expiry = asyncio.get_running_loop().call_later(
            self.limits.ttl, self.evict, log.stream_id
        )
        if self.used > self.limits.memory:
            self.trim(log)

    def evict(self, stream_id: str) -> None:
        log = self.streams.pop(stream_id, None)
        self.done.pop(stream_id, None)
        if log is not None:
            self.used -= log.size + len(log.tail)
            if log.expiry is not None:
                log.expiry.cancel()

    async def ping(self) -> None:
        pass

    async def aclose(self) -> None:
        for stream_id in list(self.done):
            self.evict(stream_id)
