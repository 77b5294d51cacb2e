"""The Redis Streams store: any replica can serve a resume (redis-py's asyncio client).

Keys, for a stream `<id>` (prefix `sidestream:resume:`):

- `<id>` — a Redis stream: event n is entry `<n>-1` with field `e` (empty: `store.LOST`, an
  event too large to store); the end marker is one more entry with field `end` (the
  outcome). Trimmed by `XTRIM MINID` past `max_bytes`, expired `ttl` seconds after its last
  write;
- `<id>:m` — JSON: the credential hash `c` (`ids.credential_hash`), the producing replica
  `r`, the first response's allowed origin `o`, the generating span `t`; same expiry;
- `<id>:r` — present while a reader on some replica is attached (refreshed by it), so the
  producing replica's grace period waits for it;
- `replica:<replica>` — the producing replica's liveness, refreshed every second with a
  3 s expiry: a reader whose producer vanished ends with a terminal `upstream_error`;
- channel `stop` — DELETE on any replica publishes the id; its producer stops it.

Appends are batched: every stream's events of the last `FLUSH_SECONDS` go in one pipelined
request, one in flight at a time (never a round trip per token), of at most `BATCH_OPS`
operations (a backlog goes out in several, back to back); a live stream's expiry is
refreshed at most once a second. The store never breaks a live stream: a failed write is
counted, logged once, and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from middleware.resume.ids import same_credentials
from middleware.resume.redis_connect import connect, shown
from middleware.resume.store import (
    LOST,
    Limits,
    ResumeGap,
    ResumePointGone,
    StoreUnavailable,
    StreamNotFound,
)

logger = logging.getLogger("sidestream")

PREFIX = "sidestream:resume:"
LIVENESS_MS = 3000
REFRESH_SECONDS = 1.0
READER_MS = 5000
BLOCK_MS = 1000
MAX_PENDING_BYTES = 64 * 1024 * 1024
OPEN_RETRIES, OPEN_RETRY_SECONDS = 2, 0.05  # an unknown id: looked up again, 100 ms in all
FLUSH_SECONDS = 0.02  # how long appends gather before one write: latency to other replicas
# Operations in one pipelined write at most. A pipeline is built and its replies read in
# Python while the event loop waits: a backlog written at once (a burst of fast streams)
# held every other stream's first token for seconds; at this size the loop waits ~10 ms at most.
BATCH_OPS = 500
# Appends go to Redis as one script call per run of them (`_Appends`), not one XADD command
# each: redis-py packs every argument and reads every reply in Python, which came to most of
# the store's CPU per token. The events travel end to end in one argument, with one of their
# places (key number, entry number, length each), so that the call has a few arguments
# whatever the run's length. Each XADD stands alone, as separate commands did: one that fails
# (pcall) does not stop the rest. Sent whole (EVAL, not EVALSHA): Redis caches the compiled
# script, and a restarted Redis needs nothing loaded again.
_ADD_EACH = """
local events, at = ARGV[1], 1
for key, n, size in string.gmatch(ARGV[2], '(%d+) (%d+) (%d+)') do
  local stop = at + tonumber(size)
  redis.pcall('XADD', KEYS[tonumber(key)], n .. '-1', 'e', string.sub(events, at, stop - 1))
  at = stop
end
"""


class _Appends:
    """A run of appends to one or more streams, written as one `_ADD_EACH` call."""

    __slots__ = ("events", "keys", "places")

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}  # stream key -> its number in the call's KEYS (from 1)
        self.events: list[bytes] = []
        self.places: list[str] = []

    def add(self, key: str, n: int, event: bytes) -> None:
        number = self.keys.setdefault(key, len(self.keys) + 1)
        self.events.append(event)
        self.places.append(f"{number} {n} {len(event)}")

    def write(self, pipe: Any) -> None:
        """Queue the call on `pipe` (nothing when the run is empty) and start a new run."""
        if self.events:
            keys, events, places = self.keys, b"".join(self.events), " ".join(self.places)
            pipe.execute_command("EVAL", _ADD_EACH, len(keys), *keys, events, places)
            self.keys, self.events, self.places = {}, [], []


class RedisLog:
    """The producing side of one stream: its index, byte count and first kept event."""

    __slots__ = ("end_seen", "first", "n", "resumes", "sizes", "store", "stream_id", "total")

    def __init__(self, store: RedisStore, stream_id: str) -> None:
        self.store = store
        self.stream_id = stream_id
        self.n = 0
        self.first = 1
        self.sizes: list[int] = []  # bytes of events first.. (for the per-stream bound)
        self.total = 0
        self.resumes = 0
        self.end_seen = False

    @property
    def max_bytes(self) -> int:
        return int(self.store.limits.max_bytes)

    def append(self, event: bytes) -> None:
        self.n += 1
        self.sizes.append(len(event))
        self.total += len(event)
        self.store.queue(("add", self.stream_id, self.n, event))
        if self.total > self.store.limits.max_bytes:
            first = self.first
            while self.total > self.store.limits.max_bytes and len(self.sizes) > 1:
                self.total -= self.sizes.pop(0)
                self.first += 1
            if self.first != first:
                self.store.queue(("trim", self.stream_id, self.first, b""))

    def retract(self, count: int) -> None:
        self.store.retract(count)
        self.n -= count
        for _ in range(min(count, len(self.sizes))):
            self.total -= self.sizes.pop()

    def end(self, tail: bytes, outcome: str) -> None:
        if tail:
            self.append(tail)
        self.store.queue(("end", self.stream_id, self.n + 1, outcome.encode()))

    async def remote_readers(self) -> bool:
        return bool(await self.store.client.exists(f"{PREFIX}{self.stream_id}:r"))


class RedisReader:
    """One resume request's cursor: XREAD after the last entry it has."""

    __slots__ = ("cursor", "link", "origin", "point", "refreshed", "replica", "store", "stream_id")

    def __init__(self, store: RedisStore, stream_id: str, after: int, meta: dict[str, str]) -> None:
        self.origin = meta.get("o", "")
        self.link = meta.get("t", "")
        self.replica = meta.get("r", "")
        self.store = store
        self.stream_id = stream_id
        self.cursor = f"{after}-1" if after else "0-0"
        self.refreshed = 0.0
        self.point = after  # -1 once an entry came; until then XREAD may be past the end

    async def read(self, timeout: float | None) -> tuple[list[bytes], bool]:
        client, key = self.store.client, PREFIX + self.stream_id
        loop = asyncio.get_running_loop()
        block = BLOCK_MS if timeout is None else int(min(timeout, BLOCK_MS / 1000) * 1000)
        try:
            if loop.time() - self.refreshed > REFRESH_SECONDS:
                self.refreshed = loop.time()
                await client.set(f"{key}:r", b"1", px=READER_MS)
            last = self.point >= 0 and await client.xrevrange(key, "+", "-", count=1)
            if last and b"end" in last[0][1] and int(last[0][0].split(b"-")[0]) <= self.point:
                return [], True  # at or past the last event of a finished stream: its end, now
            reply = await client.xread({key: self.cursor}, block=max(block, 1))
            if not reply:
                if not await client.exists(f"{PREFIX}replica:{self.replica}"):
                    return [_upstream_gone()], True
                return [], False
        except aioredis.RedisError as exc:
            self.store.failed(exc)
            raise StoreUnavailable() from exc
        self.point = -1  # the end entry now lies after the cursor: XREAD returns it
        events: list[bytes] = []
        for entry_id, fields in reply[0][1]:
            if b"end" in fields:
                self.cursor = entry_id.decode()
                return events, True
            event = fields[b"e"]
            if event == LOST:  # the events before it, then (next read) the end of this reader
                if not events:
                    raise ResumeGap()
                return events, False
            self.cursor = entry_id.decode()
            events.append(event)
        return events, False

    def close(self) -> None:
        pass


def _upstream_gone() -> bytes:
    error = {
        "message": "the replica producing this stream is gone",
        "type": "upstream_error",
        "code": "upstream_error",
    }
    return b"data: " + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n\n"


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
        # Operations not written yet: a batch is taken from the head, `retract` from the tail.
        self.pending: deque[tuple[str, str, int, bytes]] = deque()
        self.pending_bytes = 0
        self.flushing: asyncio.Task[None] | None = None
        self.refreshed: dict[str, float] = {}  # a live stream's keys: expiry last set at
        self.opened = False  # a stream was opened since the last write: write it at once
        self.background: list[asyncio.Task[None]] = []
        self.failures = 0
        self.failing = False

    # -- the producing side: sync, never raising ------------------------------------------

    def open(self, stream_id: str, credentials: str, origin: str = "", link: str = "") -> RedisLog:
        if not self.background:
            self.start()
        meta = {"c": credentials, "r": self.replica, "o": origin, "t": link}
        self.opened = True  # its client may resume on another replica at once: no gathering
        self.queue(("open", stream_id, 0, json.dumps(meta).encode()))
        return RedisLog(self, stream_id)

    def queue(self, item: tuple[str, str, int, bytes]) -> None:
        self.pending.append(item)
        self.pending_bytes += len(item[3])
        if self.pending_bytes > MAX_PENDING_BYTES:
            self.failed(RuntimeError("Redis is not keeping up: events dropped"))
            self.pending.clear()
            self.pending_bytes = 0
        if self.flushing is None:
            self.flushing = asyncio.get_running_loop().create_task(self._flush())

    def retract(self, count: int) -> None:
        pending = self.pending
        while count and pending and pending[-1][0] in ("add", "trim"):
            if pending.pop()[0] == "add":
                count -= 1

    async def _flush(self) -> None:
        """One pipelined write of everything queued; again while more came meanwhile."""
        loop = asyncio.get_running_loop()
        try:
            while self.pending:
                backlog = len(self.pending) >= BATCH_OPS  # no gathering: write what waits
                await asyncio.sleep(0 if self.opened or backlog else FLUSH_SECONDS)
                self.opened = False
                take = self.pending.popleft
                batch = [take() for _ in range(min(BATCH_OPS, len(self.pending)))]
                self.pending_bytes -= sum(len(item[3]) for item in batch)
                ttl = int(self.limits.ttl * 1000)
                pipe = self.client.pipeline(transaction=False)
                touched: set[str] = set()
                now, refreshed = loop.time(), self.refreshed
                adds = _Appends()
                for op, stream_id, n, data in batch:
                    key = PREFIX + stream_id
                    if op == "add":
                        adds.add(key, n, data)
                        if now - refreshed.get(key, 0.0) > REFRESH_SECONDS:
                            refreshed[key] = now
                            touched.add(key)
                        continue
                    adds.write(pipe)  # before this stream's trim or end, in order
                    if op == "trim":
                        pipe.xtrim(key, minid=f"{n}-0")
                    elif op == "open":
                        pipe.set(f"{key}:m", data, px=ttl)
                    else:
                        pipe.xadd(key, {b"end": data}, id=f"{n}-1")
                        refreshed.pop(key, None)
                        touched.add(key)
                adds.write(pipe)
                for key in touched:  # a live stream's keys last `ttl` past its last write
                    pipe.pexpire(key, ttl)
                    pipe.pexpire(f"{key}:m", ttl)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except aioredis.RedisError as exc:
                    self.failed(exc)
                    continue
                # A command Redis refused (a server without scripting, a key of another
                # type): counted and logged like a lost connection, not passed over.
                refused = next((r for r in replies if isinstance(r, Exception)), None)
                if refused is not None:
                    self.failed(refused)
                else:
                    self.failing = False
        finally:
            self.flushing = None

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if not self.failing:
            self.failing = True
            logger.warning("resume store (Redis %s) failed: %s", self.url, exc)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.background = [loop.create_task(self._alive()), loop.create_task(self._listen())]

    async def _alive(self) -> None:
        key = f"{PREFIX}replica:{self.replica}"
        while True:
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self.client.set(key, b"1", px=LIVENESS_MS)
            await asyncio.sleep(REFRESH_SECONDS)

    async def _listen(self) -> None:
        """Stops asked on other replicas (DELETE), for the streams produced here."""
        while True:
            try:
                pubsub = self.client.pubsub()
                await pubsub.subscribe(PREFIX + "stop")
                async for message in pubsub.listen():
                    if message["type"] == "message" and self.on_stop is not None:
                        self.on_stop(message["data"].decode())
            except (aioredis.RedisError, OSError):
                await asyncio.sleep(REFRESH_SECONDS)

    # -- the reading side ------------------------------------------------------------------

    async def _meta(self, stream_id: str, credentials: str) -> dict[str, str]:
        """The stream's meta: credentials hash `c`, producing replica `r`, the first
        response's allowed origin `o`, the generating span `t`."""
        try:
            meta = await self.client.get(f"{PREFIX}{stream_id}:m")
            for _ in range(OPEN_RETRIES):  # a stream just opened elsewhere may be a write behind
                if meta is not None:
                    break
                await asyncio.sleep(OPEN_RETRY_SECONDS)
                meta = await self.client.get(f"{PREFIX}{stream_id}:m")
        except aioredis.RedisError as exc:
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
        try:
            first = await self.client.xrange(PREFIX + stream_id, "-", "+", count=1)
        except aioredis.RedisError as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc
        if first and int(first[0][0].split(b"-")[0]) > after + 1 and b"e" in first[0][1]:
            raise ResumePointGone()
        return RedisReader(self, stream_id, after, meta)

    async def check(self, stream_id: str, credentials: str) -> None:
        await self._meta(stream_id, credentials)

    async def stop_elsewhere(self, stream_id: str) -> None:
        try:
            await self.client.publish(PREFIX + "stop", stream_id)
        except aioredis.RedisError as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc

    async def ping(self) -> None:
        """At start: Redis unreachable is a warning, not an exit (resume answers 503)."""
        try:
            await self.client.ping()
        except (aioredis.RedisError, OSError) as exc:
            if not self.failing:  # one line, until a write succeeds (`failed`, `_flush`)
                self.failing = True
                logger.warning("resume store: Redis at %s is unusable now: %s", self.url, exc)

    async def aclose(self) -> None:
        for task in self.background:
            task.cancel()
        await self.client.aclose()
