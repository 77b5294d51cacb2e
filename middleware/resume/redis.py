"""The Redis Streams store: any replica can serve a resume (redis-py's asyncio client).

Keys: `redis_keys`; a resume request's cursor: `redis_reader`; what one write holds:
`redis_writes`.

Appends are batched: every stream's events of the last `FLUSH_SECONDS` go in one pipelined
request, one in flight at a time (never a round trip per token), of at most `BATCH_OPS`
operations (a backlog goes out in several, back to back); a live stream's expiry is
refreshed at most once a second, and the write that refreshes it says whether a reader is
attached to the stream (its `:r` key): such a stream is written in the turn its events come,
from then until a write says its reader has gone. The store never breaks a live stream: a
failed write is counted, logged (once a minute at most), and dropped; the producer keeps its own copy of each
stream (within `max_bytes`, and `ENDED_HOLD` past its end), and once Redis answers again,
whatever Redis lacks of it is re-appended before anything else is written (`_repair`): after
a restart, or a Sentinel failover that lost the writes not yet replicated.

On a Redis Cluster (`redis+cluster://`) the same, with each stream's keys under one hash tag
(`redis_keys.Keys`) and a run of appends split into one script call per slot (`SlotAppends`):
the cluster pipeline sends each command to its slot's node; MOVED and ASK are followed
(`redis_batch`: redis-py's own ASK following fails on a pooled connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import AskError, ClusterError, MovedError, TryAgainError

from middleware.resume.ids import same_credentials
from middleware.resume.redis_batch import Batches
from middleware.resume.redis_connect import CLUSTER, ERRORS, connect, shown
from middleware.resume.redis_keys import PREFIX as PREFIX
from middleware.resume.redis_keys import REFRESH_SECONDS, REPLICA, STOP, Keys
from middleware.resume.redis_reader import BLOCK_MS, RedisReader
from middleware.resume.redis_writes import Sent, batch_commands, checked, restore_all
from middleware.resume.store import (
    Limits,
    ResumePointGone,
    StoreUnavailable,
    StreamNotFound,
)

logger = logging.getLogger("sidestream")

LIVENESS_MS = 3000
MAX_PENDING_BYTES = 64 * 1024 * 1024
OPEN_RETRIES, OPEN_RETRY_SECONDS = 2, 0.05  # an unknown id: looked up again, 100 ms in all
FLUSH_SECONDS = 0.02  # how long appends gather before one write: latency to other replicas
# Operations in one pipelined write at most. A pipeline is built and its replies read in
# Python while the event loop waits: a backlog written at once (a burst of fast streams)
# held every other stream's first token for seconds; at this size the loop waits ~10 ms at most.
BATCH_OPS = 500
ENDED_HOLD = 10.0  # seconds an ended stream's copy is kept, to restore its end after a failover
LOG_EVERY = 60.0  # seconds between two log lines while the store keeps failing


# Errors after which Redis may lack writes it once took: `_repair` restores them.
_LOSING = (aioredis.ReadOnlyError, ClusterError, TryAgainError, AskError, MovedError)


def mark_watched(logs: dict[str, RedisLog], keys: Keys, sent: Sent, replies: list[Any]) -> None:
    """`watched` of each stream a write's script calls were asked about, as they answer."""
    for at, asked in sent:
        for key, attached in zip(asked, replies[at], strict=True):
            log = logs.get(keys.stream_id(key))
            if log is not None:
                log.watched = attached == 1


def _done(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)


class RedisLog:
    """The producing side of one stream: its index, and its own copy of the events it keeps
    (from `first`, within `max_bytes`), from which what a failover lost is re-appended."""

    __slots__ = (
        "end_seen", "events", "first", "meta", "n", "outcome", "resumes", "store", "stream_id",
        "total", "watched",
    )  # fmt: skip

    def __init__(self, store: RedisStore, stream_id: str, meta: bytes) -> None:
        self.store = store
        self.stream_id = stream_id
        self.meta = meta
        self.n = 0
        self.first = 1
        self.events: deque[bytes] = deque()  # events first..n
        self.total = 0
        self.resumes = 0
        self.end_seen = False
        self.outcome: bytes | None = None
        self.watched = False  # a reader is attached: its events are written in their turn

    @property
    def max_bytes(self) -> int:
        return int(self.store.limits.max_bytes)

    def append(self, event: bytes) -> None:
        self.n += 1
        self.events.append(event)
        self.total += len(event)
        self.store.queue(("add", self.stream_id, self.n, event))
        if self.watched:
            self.store.hurry()
        if self.total > self.store.limits.max_bytes:
            first = self.first
            while self.total > self.store.limits.max_bytes and len(self.events) > 1:
                self.total -= len(self.events.popleft())
                self.first += 1
            if self.first != first:
                self.store.queue(("trim", self.stream_id, self.first, b""))

    def retract(self, count: int) -> None:
        self.store.retract(count)
        self.n -= count
        for _ in range(min(count, len(self.events))):
            self.total -= len(self.events.pop())

    def end(self, tail: bytes, outcome: str) -> None:
        if tail:
            self.append(tail)
        self.outcome = outcome.encode()
        self.store.queue(("end", self.stream_id, self.n + 1, self.outcome))
        self.store.ended(self.stream_id)

    async def remote_readers(self) -> bool:
        return bool(await self.store.client.exists(self.store.keys.stream(self.stream_id) + ":r"))


class RedisStore:
    """See the module docstring."""

    def __init__(
        self,
        url: str,
        limits: Limits | None = None,
        *,
        password: str | None = None,
        ca: str | None = None,
    ) -> None:
        self.url = shown(url)  # never the password: it is in log lines
        self.limits = limits or Limits()
        self.on_stop: Callable[[str], object] | None = None
        self.replica = secrets.token_urlsafe(9)
        timeouts = {"socket_connect_timeout": 1.0, "socket_timeout": BLOCK_MS / 1000 + 4}
        self.client: Any = connect(url, password=password, ca=ca, **timeouts)  # redis_connect
        self.cluster = url.startswith(CLUSTER)
        self.keys = Keys(self.cluster)
        self.batches = Batches(self.client, self.cluster)
        # Operations not written yet: a batch is taken from the head, `retract` from the tail.
        self.pending: deque[tuple[str, str, int, bytes]] = deque()
        self.pending_bytes = 0
        self.flushing: asyncio.Task[None] | None = None
        self.gathering: asyncio.Future[None] | None = None  # `_flush` waiting: `hurry` ends it
        self.refreshed: dict[str, float] = {}  # a live stream's keys: expiry last set at
        self.at_once = False  # a stream was opened, or a watched one appended: write next turn
        self.background: list[asyncio.Task[None]] = []
        self.failures = 0
        self.failing = False
        self.logged = 0.0  # when the last failure line was written (one a minute at most)
        # A write or read failed: what Redis holds of the streams below may be behind what
        # the producer sent (a failover loses the writes not yet replicated), so the next
        # write first restores them (`_repair`).
        self.suspect = False
        self.logs: dict[str, RedisLog] = {}  # produced here, live or ended `ENDED_HOLD` ago

    # -- the producing side: sync, never raising ------------------------------------------

    def open(self, stream_id: str, credentials: str, origin: str = "", link: str = "") -> RedisLog:
        if not self.background:
            self.start()
        meta = {"c": credentials, "r": self.replica, "o": origin, "t": link}
        self.at_once = True  # its client may resume on another replica at once: no gathering
        log = self.logs[stream_id] = RedisLog(self, stream_id, json.dumps(meta).encode())
        self.queue(("open", stream_id, 0, log.meta))
        return log

    def ended(self, stream_id: str) -> None:
        asyncio.get_running_loop().call_later(ENDED_HOLD, self.logs.pop, stream_id, None)

    def queue(self, item: tuple[str, str, int, bytes]) -> None:
        self.pending.append(item)
        self.pending_bytes += len(item[3])
        if self.pending_bytes > MAX_PENDING_BYTES:
            self.failed(RuntimeError("Redis is not keeping up: events dropped"))
            self.pending.clear()
            self.pending_bytes = 0
        if self.flushing is None:
            self.flushing = asyncio.get_running_loop().create_task(self._flush())

    def hurry(self) -> None:
        """Write what is queued in the next turn, not after the gathering."""
        self.at_once = True
        if self.gathering is not None and not self.gathering.done():
            self.gathering.set_result(None)

    async def _gather(self) -> None:
        """`FLUSH_SECONDS`, or less if `hurry` is called meanwhile."""
        loop = asyncio.get_running_loop()
        self.gathering = waiting = loop.create_future()
        timer = loop.call_later(FLUSH_SECONDS, _done, waiting)
        try:
            await waiting
        finally:
            timer.cancel()
            self.gathering = None

    def retract(self, count: int) -> None:
        pending = self.pending
        while count and pending and pending[-1][0] in ("add", "trim"):
            if pending.pop()[0] == "add":
                count -= 1

    async def _flush(self) -> None:
        """One pipelined write of everything queued; again while more came meanwhile."""
        loop = asyncio.get_running_loop()
        try:
            while self.pending or self.suspect:
                if self.at_once or len(self.pending) >= BATCH_OPS:  # a backlog: write what waits
                    await asyncio.sleep(0)  # what this turn appends still goes in
                else:
                    await self._gather()
                if self.suspect:
                    if not await self._repair():  # again in a second, until Redis is back
                        await asyncio.sleep(REFRESH_SECONDS)
                    continue
                self.at_once = False
                take = self.pending.popleft
                batch = [take() for _ in range(min(BATCH_OPS, len(self.pending)))]
                self.pending_bytes -= sum(len(item[3]) for item in batch)
                slot = self.client.keyslot if self.cluster else None
                commands, sent = batch_commands(
                    batch, self.keys, slot, int(self.limits.ttl * 1000), self.refreshed, loop.time()
                )
                # A command Redis refused (a server without scripting, a key of another
                # type): counted and logged like a lost connection, not passed over.
                try:
                    replies = checked(await self.batches.run(commands))
                except ERRORS as exc:
                    self.failed(exc)
                else:
                    self.failing = False
                    mark_watched(self.logs, self.keys, sent, replies)
        finally:
            self.flushing = None

    async def _repair(self) -> bool:
        """Every held stream's last entry in Redis, then what it lacks after it, from the
        producer's copy (`redis_writes.restore`); False while Redis cannot be written."""
        # What is queued is in the copies: dropped, and the copies as they are now written.
        self.pending.clear()
        self.pending_bytes = 0
        # As they are now (a copy: a stream may append or retract while Redis is asked).
        key = self.keys.stream
        held = [
            (key(log.stream_id), log.meta, log.first, tuple(log.events), log.n, log.outcome)
            for log in self.logs.values()
        ]
        try:
            await restore_all(self.batches, held, int(self.limits.ttl * 1000))
        except ERRORS as exc:
            self.pending.clear()  # in the copies too, for the next try
            self.pending_bytes = 0
            self.failed(exc)
            return False
        self.suspect = self.failing = False
        logger.warning("resume store (Redis %s) is back: %d streams restored", self.url, len(held))
        return True

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        # A command Redis refuses is refused again: only a lost connection (or a primary
        # turned replica, a cluster node down or between owners) may have lost writes that a
        # repair restores.
        lost = not isinstance(exc, aioredis.ResponseError)
        self.suspect |= lost or isinstance(exc, _LOSING)
        now = time.monotonic()
        if not self.failing or now - self.logged >= LOG_EVERY:
            self.failing, self.logged = True, now
            logger.warning("resume store (Redis %s) failed: %s", self.url, exc)
        if self.suspect and self.flushing is None:  # restore what it lost once it is back
            self.flushing = asyncio.get_running_loop().create_task(self._flush())

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.background = [loop.create_task(self._alive()), loop.create_task(self._listen())]

    async def _alive(self) -> None:
        """The replica's liveness key, every second; and so the store's state (`failing`,
        which `/readyz` shows) even while no stream writes: an unreachable store is noticed,
        and one that returns is written back to (`_repair`) and no longer failing."""
        key = REPLICA + self.replica
        while True:
            try:
                await self.client.set(key, b"1", px=LIVENESS_MS)
            except ERRORS as exc:
                self.failed(exc)
            else:
                self.failing = self.failing and self.suspect  # else `_repair` clears it
            await asyncio.sleep(REFRESH_SECONDS)

    async def _listen(self) -> None:
        """Stops asked on other replicas (DELETE), for the streams produced here."""
        while True:
            try:
                pubsub = self.client.pubsub()
                await pubsub.subscribe(STOP)
                async for message in pubsub.listen():
                    if message["type"] == "message" and self.on_stop is not None:
                        self.on_stop(message["data"].decode())
            except ERRORS:
                await asyncio.sleep(REFRESH_SECONDS)

    # -- the reading side ------------------------------------------------------------------

    async def _meta(self, stream_id: str, credentials: str) -> dict[str, str]:
        """The stream's meta: credentials hash `c`, producing replica `r`, the first
        response's allowed origin `o`, the generating span `t`."""
        key = self.keys.stream(stream_id) + ":m"
        try:
            meta = await self.client.get(key)
            for _ in range(OPEN_RETRIES):  # a stream just opened elsewhere may be a write behind
                if meta is not None:
                    break
                await asyncio.sleep(OPEN_RETRY_SECONDS)
                meta = await self.client.get(key)
        except ERRORS as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc
        if meta is None:
            raise StreamNotFound()
        fields: dict[str, str] = json.loads(meta)
        if not same_credentials(fields.get("c", ""), credentials):
            raise StreamNotFound()
        return fields

    async def attach(self, stream_id: str, after: int, credentials: str) -> RedisReader:
        meta = await self._meta(stream_id, credentials)
        key = self.keys.stream(stream_id)
        try:
            first = await self.client.xrange(key, "-", "+", count=1)
        except ERRORS as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc
        if first and int(first[0][0].split(b"-")[0]) > after + 1 and b"e" in first[0][1]:
            raise ResumePointGone()
        return RedisReader(self.client, self.failed, key, after, meta)

    async def check(self, stream_id: str, credentials: str) -> None:
        await self._meta(stream_id, credentials)

    async def stop_elsewhere(self, stream_id: str) -> None:
        try:
            await self.client.publish(STOP, stream_id)
        except ERRORS as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc

    async def ping(self) -> None:
        """At start: Redis unreachable is a warning, not an exit (resume answers 503); the
        liveness loop (`_alive`) then follows whether it is reachable."""
        if not self.background:
            self.start()
        try:
            await self.client.ping()
        except ERRORS as exc:
            if not self.failing:  # one line, until a write succeeds (`failed`, `_flush`)
                self.failing, self.logged = True, time.monotonic()
                logger.warning("resume store: Redis at %s is unusable now: %s", self.url, exc)

    async def aclose(self) -> None:
        for task in [*self.background, *([self.flushing] if self.flushing else [])]:
            task.cancel()
        await self.batches.aclose()
        await self.client.aclose()
