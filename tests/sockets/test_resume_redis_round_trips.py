"""The Redis store's round trips, counted on a real `redis-server`: the events that many
streams append in one loop turn go to Redis in one pipelined request (one script call), and
a reader waiting on one of those streams gets that turn's events in one read, from that
one write; a stream a reader is attached to is written in its turn, not after the
gathering."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from middleware.resume import redis as redis_store
from middleware.resume.redis import PREFIX, RedisStore
from tests.support.redis import RedisServer

STREAMS = 10
GATHERING = 3.0  # seconds: the store's gathering, made long enough to tell from one turn
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


class CountedPipelines:
    """`client.pipeline`, wrapped: each pipeline's `execute` (one round trip) is counted."""

    def __init__(self, client: Any) -> None:
        self.make = client.pipeline
        self.round_trips = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self.make(*args, **kwargs)
        execute = pipe.execute

        async def counted(*a: Any, **kw: Any) -> Any:
            self.round_trips += 1
            return await execute(*a, **kw)

        pipe.execute = counted
        return pipe


async def written(store: RedisStore) -> None:
    deadline = time.monotonic() + 30
    while store.flushing is not None or store.pending:
        assert time.monotonic() < deadline, "the store's queue was not written within 30 s"
        await asyncio.sleep(0.005)


async def calls(client: aioredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_one_turns_events_of_many_streams_go_in_one_round_trip(redis: RedisServer) -> None:
    """Rule: the events appended in one loop turn, by many streams and several by one, reach
    Redis in one pipelined request holding one script call (not a request, nor a command,
    per event); Redis stores each of them; and a reader blocked on one of those streams gets
    all of that turn's events for it in one read."""
    store = RedisStore(redis.url)
    counter = CountedPipelines(store.client)
    store.client.pipeline = counter
    probe = aioredis.Redis(port=redis.port)
    try:
        logs = [store.open(f"t{i}", "c") for i in range(STREAMS)]
        await written(store)  # the opens' write: the metas
        reader = await store.attach("t0", 0, "c")
        reading = asyncio.create_task(reader.read(5.0))
        deadline = time.monotonic() + 30
        while not await calls(probe, "xread"):  # until the reader is blocked in XREAD
            assert time.monotonic() < deadline, "the reader never reached XREAD"
            await asyncio.sleep(0.005)
        trips, evals, xadds = (
            counter.round_trips,
            *[await calls(probe, c) for c in ("eval", "xadd")],
        )

        for i, log in enumerate(logs):  # one turn: no await between the appends
            log.append(EVENT + b"%d" % i)
        logs[0].append(EVENT + b"second")
        logs[0].append(EVENT + b"third")
        await written(store)

        assert counter.round_trips - trips == 1
        assert await calls(probe, "eval") - evals == 1
        assert await calls(probe, "xadd") - xadds == STREAMS + 2
        for i in range(1, STREAMS):
            entries = await probe.xrange(PREFIX + f"t{i}")
            assert [fields[b"e"] for _, fields in entries] == [EVENT + b"%d" % i]
        events, ended = await reading
        assert events == [EVENT + b"0", EVENT + b"second", EVENT + b"third"]
        assert not ended
    finally:
        await probe.aclose()
        await store.aclose()


async def test_a_stream_a_reader_is_attached_to_is_written_in_its_turn(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: once a write has told the producer that a reader is attached to a stream (its
    `:r` key), that stream's events go to Redis in the turn they come, not after the gathering
    (`FLUSH_SECONDS`, made 3 s here so that the two cannot be confused); a stream nobody reads
    still waits for the gathering."""
    monkeypatch.setattr(redis_store, "FLUSH_SECONDS", GATHERING)
    store = RedisStore(redis.url)
    probe = aioredis.Redis(port=redis.port)
    try:
        watched, alone = store.open("w", "c"), store.open("a", "c")
        await written(store)  # the opens' write: at once
        reader = await store.attach("w", 0, "c")
        reading = asyncio.create_task(reader.read(10.0))  # sets `w:r`, then waits in XREAD
        deadline = time.monotonic() + 30
        while not await calls(probe, "xread"):
            assert time.monotonic() < deadline, "the reader never reached XREAD"
            await asyncio.sleep(0.005)
        watched.append(EVENT + b"1")  # gathered: its write's reply tells the producer
        events, _ = await reading
        while not events:  # a read waits a second at most (BLOCK_MS): the gathering is longer
            assert time.monotonic() < deadline, "the first event never came"
            events, _ = await reader.read(10.0)
        assert events == [EVENT + b"1"]
        await written(store)  # the reader may have it before the producer read the reply
        assert watched.watched and not alone.watched

        for n in (2, 3):  # each in the one read it is appended during (BLOCK_MS < GATHERING)
            reading = asyncio.create_task(reader.read(10.0))
            watched.append(EVENT + b"%d" % n)
            assert await reading == ([EVENT + b"%d" % n], False)

        alone.append(EVENT + b"alone")
        await asyncio.sleep(GATHERING / 3)
        assert await probe.xlen(PREFIX + "a") == 0  # gathering still
        await written(store)
        assert await probe.xlen(PREFIX + "a") == 1
    finally:
        await probe.aclose()
        await store.aclose()
