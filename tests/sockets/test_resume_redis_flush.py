"""The Redis store's writes under a backlog, against a real `redis-server`: events that pile
up faster than Redis takes them (a burst of fast streams, their readers gone, run on into the
store) go out whole and in order, in writes small enough that the event loop keeps serving
every other stream meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from middleware.resume.redis import PREFIX, RedisStore
from tests.support.redis import RedisServer, redis_server

STREAMS, EVENTS = 64, 2000  # 128,000 events: a few seconds of the benchmark's flood
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


@pytest.fixture
async def redis() -> AsyncIterator[RedisServer]:
    async with redis_server() as server:
        yield server


async def test_a_backlog_goes_out_whole_without_holding_the_loop(redis: RedisServer) -> None:
    """Rule: a backlog of queued events is written in bounded pieces, so no write holds the
    event loop for long (written at once, 128k events held it 0.8 s, which every other
    stream's first token waited out); and every event arrives, in its stream's order."""
    store = RedisStore(redis.url)
    try:
        logs = [store.open(f"s{i}", "c") for i in range(STREAMS)]
        stalls: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:  # what any other stream's task sees of the loop
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        for n in range(EVENTS):
            for log in logs:
                log.append(EVENT + b"%d" % n)
            if n % 50 == 0:  # the producers yield as relays do, between reads
                await asyncio.sleep(0)
        for log in logs:
            log.end(b"", "stop")
        deadline = time.monotonic() + 60
        while store.flushing is not None or store.pending:
            assert time.monotonic() < deadline, "the backlog was not written within 60 s"
            await asyncio.sleep(0.01)
        done.set()
        await tick

        assert max(stalls) < 0.3, f"the loop was held {max(stalls) * 1000:.0f} ms"
        assert store.failures == 0
        for i in (0, STREAMS // 2, STREAMS - 1):
            entries = await store.client.xrange(PREFIX + f"s{i}")
            assert [fields.get(b"e") for _, fields in entries[:-1]] == [
                EVENT + b"%d" % n for n in range(EVENTS)
            ]
            assert entries[-1][1] == {b"end": b"stop"}
    finally:
        await store.aclose()
