"""What the Redis store writes in one pipelined request (`redis_batch`): a run of appends as
one script call, and, after a failure, what a stream lacks in Redis, re-appended from the
producer's copy.

Entry ids are event numbers (`<n>-1`), and Redis refuses an `XADD` whose id is not above the
stream's last: an event written twice is refused, never stored twice. So re-appending what
the store lost needs no bookkeeping of what was written before, only the store's last entry.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from middleware.resume.redis_batch import Batches, Command
from middleware.resume.redis_keys import REFRESH_SECONDS, Keys

# A stream as its producer holds it: its key, its meta, its first kept event's number, the
# events it keeps, the last one's number, and its outcome once it ended.
Held = tuple[str, bytes, int, Sequence[bytes], int, bytes | None]

# Appends go to Redis as one script call per run of them (`Appends`), not one XADD command
# each: redis-py packs every argument and reads every reply in Python, which came to most of
# the store's CPU per token. The events travel end to end in one argument, with one of their
# places (key number, entry number, length each), so that the call has a few arguments
# whatever the run's length. Each XADD stands alone, as separate commands did: one that fails
# (pcall) does not stop the rest. Sent whole (EVAL, not EVALSHA): Redis caches the compiled
# script, and a restarted Redis needs nothing loaded again. For the streams it is asked
# about (their key numbers in ARGV[3]: `Appends.ask`), it answers 1 where a reader is
# attached (`<key>:r`, in the stream's slot), 0 where none: the producer writes the first
# kind in the turn their events come (`RedisLog.watched`).
_ADD_EACH = """
local events, at, readers = ARGV[1], 1, {}
for key, n, size in string.gmatch(ARGV[2], '(%d+) (%d+) (%d+)') do
  local stop = at + tonumber(size)
  redis.pcall('XADD', KEYS[tonumber(key)], n .. '-1', 'e', string.sub(events, at, stop - 1))
  at = stop
end
for key in string.gmatch(ARGV[3], '%d+') do
  readers[#readers + 1] = redis.pcall('EXISTS', KEYS[tonumber(key)] .. ':r')
end
return readers
"""


# Each script call's place in its request and the stream keys it asked about, in order: its
# reply says of each whether a reader is attached (1) or not (0).
Sent = list[tuple[int, tuple[str, ...]]]


class Appends:
    """A run of appends to one or more streams, written as one `_ADD_EACH` call (each call
    noted in `sent` when given)."""

    __slots__ = ("asked", "events", "keys", "places", "sent")

    def __init__(self, sent: Sent | None = None) -> None:
        self.keys: dict[str, int] = {}  # stream key -> its number in the call's KEYS (from 1)
        self.events: list[bytes] = []
        self.places: list[str] = []
        self.asked: list[str] = []  # keys, of those added, asked about their readers
        self.sent = sent

    def add(self, key: str, n: int, event: bytes) -> None:
        number = self.keys.setdefault(key, len(self.keys) + 1)
        self.events.append(event)
        self.places.append(f"{number} {n} {len(event)}")

    def ask(self, key: str) -> None:
        """Have the call say whether a reader is attached to `key`'s stream (added first)."""
        self.asked.append(key)

    def write(self, commands: list[Command]) -> None:
        """Add the call to `commands` (nothing when the run is empty) and start a new run."""
        if self.events:
            keys, events, places = self.keys, b"".join(self.events), " ".join(self.places)
            asked = " ".join(str(keys[key]) for key in self.asked)
            if self.sent is not None:
                self.sent.append((len(commands), tuple(self.asked)))
            commands.append(("EVAL", _ADD_EACH, len(keys), *keys, events, places, asked))
            self.keys, self.events, self.places, self.asked = {}, [], [], []


class SlotAppends:
    """`Appends` on a Redis Cluster, where a script's keys must share a slot: a run per slot
    (a stream's keys share one: `redis_keys.Keys`), each its own call, sent to that slot's
    node by the cluster pipeline."""

    __slots__ = ("runs", "sent", "slot")

    def __init__(self, slot: Callable[[str], int], sent: Sent | None = None) -> None:
        self.slot = slot  # the client's `keyslot`
        self.sent = sent
        self.runs: dict[int, Appends] = {}

    def add(self, key: str, n: int, event: bytes) -> None:
        slot = self.slot(key)
        run = self.runs.get(slot)
        if run is None:
            run = self.runs[slot] = Appends(self.sent)
        run.add(key, n, event)

    def ask(self, key: str) -> None:
        self.runs[self.slot(key)].ask(key)

    def write(self, commands: list[Command]) -> None:
        for run in self.runs.values():
            run.write(commands)
        self.runs.clear()


def batch_commands(
    batch: Sequence[tuple[str, str, int, bytes]],
    keys: Keys,
    slot: Callable[[str], int] | None,
    ttl: int,
    refreshed: dict[str, float],
    now: float,
) -> tuple[list[Command], Sent]:
    """The commands that write `batch` (the store's queued operations, in order: "open",
    "add", "trim", "end"), and where their script calls are; `slot`, a cluster's `keyslot`.
    A live stream's keys get their expiry again at most every `REFRESH_SECONDS` (`refreshed`:
    when each was last set), and its script call says then whether a reader is attached."""
    commands: list[Command] = []
    sent: Sent = []
    touched: set[str] = set()
    adds = Appends(sent) if slot is None else SlotAppends(slot, sent)
    for op, stream_id, n, data in batch:
        key = keys.stream(stream_id)
        if op == "add":
            adds.add(key, n, data)
            if now - refreshed.get(key, 0.0) > REFRESH_SECONDS:
                refreshed[key] = now
                touched.add(key)
                adds.ask(key)
            continue
        adds.write(commands)  # before this stream's trim or end, in order
        if op == "trim":
            commands.append(("XTRIM", key, "MINID", f"{n}-0"))
        elif op == "open":
            commands.append(("SET", f"{key}:m", data, "PX", ttl))
        else:
            commands.append(("XADD", key, f"{n}-1", b"end", data))
            refreshed.pop(key, None)
            touched.add(key)
    adds.write(commands)
    for key in touched:  # a live stream's keys last `ttl` past its last write
        commands.append(("PEXPIRE", key, ttl))
        commands.append(("PEXPIRE", f"{key}:m", ttl))
    return commands, sent


def stored_up_to(top: Sequence[Any]) -> int | None:
    """The last event number a stream's last entry (`XREVRANGE … COUNT 1`) shows, 0 for no
    entry, None when that entry is the end (the store has the whole stream)."""
    if not top:
        return 0
    entry_id, fields = top[0]
    return None if b"end" in fields else int(entry_id.split(b"-")[0])


def restore(commands: list[Command], key: str, stored: int, held: tuple[bytes, int, Sequence[bytes], int], ttl: int,
            outcome: bytes | None) -> None:  # fmt: skip
    """Add to `commands` what `key` lacks: its meta, the events after `stored` that the
    producer still holds (`held`: meta, its first event's number, the events, the last one's
    number), the end if the stream ended, and the expiry."""
    meta, first, events, n = held
    commands.append(("SET", f"{key}:m", meta, "PX", ttl))
    adds = Appends()
    start = max(stored + 1, first)
    for number, event in enumerate(itertools.islice(events, start - first, n - first + 1), start):
        adds.add(key, number, event)
    adds.write(commands)
    if 0 < stored < first - 1:  # a hole the producer cannot fill: a reader gets 410, not it
        commands.append(("XTRIM", key, "MINID", f"{first}-0"))
    if outcome is not None:
        commands.append(("XADD", key, f"{n + 1}-1", b"end", outcome))
    commands.append(("PEXPIRE", key, ttl))
    commands.append(("PEXPIRE", f"{key}:m", ttl))


async def restore_all(batches: Batches, held: Sequence[Held], ttl: int) -> None:
    """Two round trips: each held stream's last entry in Redis, then what it lacks after it
    (`restore`). Raises what redis-py raises, and the first command Redis refused."""
    reads: list[Command] = [] if batches.cluster else [("PING",)]  # Redis is back: no stream too
    reads += [("XREVRANGE", key, "+", "-", "COUNT", 1) for key, *_ in held]
    if batches.cluster:  # no PING in a cluster pipeline: it has no key to route it by
        await batches.client.ping()
    tops = checked(await batches.run(reads))[len(reads) - len(held) :]
    commands: list[Command] = []
    for (key, meta, first, events, n, outcome), top in zip(held, tops, strict=True):
        stored = stored_up_to(top)
        if stored is not None:
            restore(commands, key, stored, (meta, first, events, n), ttl, outcome)
    checked(await batches.run(commands))


def checked(replies: list[Any]) -> list[Any]:
    """`replies`, unless Redis refused one of their commands: then that refusal, raised."""
    refused = next((r for r in replies if isinstance(r, Exception)), None)
    if refused is not None:
        raise refused
    return replies
