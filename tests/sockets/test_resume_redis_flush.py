"""The Redis store's writes under a backlog, against a real `redis-server`: events that pile
up faster than Redis takes them (a burst of fast streams, their readers gone, run on into the
store) go out whole and in order, in writes small enough that the event loop keeps serving
every other stream meanwhile."""

from __future__ import annotations

import asyncio
import time

import pytest

from middleware.resume.redis import PREFIX, RedisStore
from middleware.resume.store import Limits, ResumePointGone
from tests.support.redis import RedisServer, redis_server

STREAMS, EVENTS = 64, 2000  # 128,000 events: a few seconds of the benchmark's flood
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


async def written(store: RedisStore) -> None:
    deadline = time.monotonic() + 60
    while store.flushing is not None or store.pending:
        assert time.monotonic() < deadline, "the store's queue was not written within 60 s"
        await asyncio.sleep(0.01)


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
        await written(store)
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


async def test_the_per_stream_bound_keeps_the_newest_events_in_order(redis: RedisServer) -> None:
    """Rule: past `max_bytes`, a stream keeps its newest events (to within a node of Redis's
    approximate trim), whole and in order, with its end after them, however its appends and
    trims fall into the store's writes; a resume from an event trimmed away is refused
    (ResumePointGone), one from a kept event reads every event after it and the end."""
    event = b"data: " + b"x" * 94 + b"\n\n"  # 102 bytes
    store = RedisStore(redis.url, Limits(max_bytes=100 * len(event)))
    try:
        logs = [store.open(f"b{i}", "c") for i in range(3)]
        for n in range(1, 1201):  # interleaved: runs of appends with trims between them
            for log in logs:
                log.append(event[:-2] + b"%d\n\n" % n)
            if n % 97 == 0:
                await asyncio.sleep(0)
        for log in logs:
            log.end(b"", "stop")
        await written(store)
        assert store.failures == 0
        # The oldest of the newest events within the bound: events 1000 on are 106 bytes, and
        # 10,200 bytes hold 96 of them.
        newest = 1201 - 100 * len(event) // 106
        for i in range(3):
            entries = await store.client.xrange(PREFIX + f"b{i}")
            ids = [int(entry_id.split(b"-")[0]) for entry_id, _ in entries]
            # A contiguous run up to the end; the trim is Redis's approximate one (`MINID ~`),
            # which frees whole nodes of the stream (100 entries each): it keeps the events
            # within the bound, and at most a node's worth before them.
            assert ids == list(range(ids[0], 1202))
            assert newest - 100 <= ids[0] <= newest
            assert entries[-2][1] == {b"e": event[:-2] + b"1200\n\n"}
            assert entries[-1][1] == {b"end": b"stop"}
        with pytest.raises(ResumePointGone):
            await store.attach("b1", 1000, "c")
        reader = await store.attach("b1", 1150, "c")
        events, ended = await reader.read(1.0)
        assert ended and events == [event[:-2] + b"%d\n\n" % n for n in range(1151, 1201)]
    finally:
        await store.aclose()


async def test_a_failing_append_costs_no_other_streams_events(redis: RedisServer) -> None:
    """Rule: appends that Redis refuses for one stream (here its key holds another type) are
    lost for that stream alone: the other streams' appends in the same write all land."""
    store = RedisStore(redis.url)
    try:
        await store.client.set(PREFIX + "broken", b"not a stream")
        broken, fine = store.open("broken", "c"), store.open("fine", "c")
        for n in range(1, 51):
            broken.append(EVENT + b"%d" % n)
            fine.append(EVENT + b"%d" % n)
        await written(store)
        entries = await store.client.xrange(PREFIX + "fine")
        assert [fields[b"e"] for _, fields in entries] == [EVENT + b"%d" % n for n in range(1, 51)]
        assert await store.client.get(PREFIX + "broken") == b"not a stream"
    finally:
        await store.aclose()


async def test_appends_redis_refuses_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: where Redis refuses the store's writes (here a server with scripting renamed
    away), the store says so: a failure counted and one warning naming Redis's error, as
    for a lost connection, and the stream is not broken (appends stay non-raising)."""
    async with redis_server("--rename-command", "EVAL", "") as server:
        store = RedisStore(server.url)
        try:
            log = store.open("refused", "c")
            with caplog.at_level("WARNING", logger="sidestream"):
                for n in range(1, 11):
                    log.append(EVENT + b"%d" % n)
                await written(store)
            assert store.failures >= 1
            assert any("unknown command" in r.getMessage().lower() for r in caplog.records)
            assert await store.client.xlen(PREFIX + "refused") == 0
        finally:
            await store.aclose()


async def test_events_of_any_bytes_are_stored_byte_for_byte(redis: RedisServer) -> None:
    """Rule: the store keeps each event's exact bytes, whatever they hold (multi-byte UTF-8,
    NUL, bytes that are not UTF-8, digits and spaces like the call's own layout) and however
    long, interleaved over streams in one write."""
    odd = [
        'data: {"content":"東京 ü 🙂"}\n\n'.encode(),
        b"data: \x00\xff\xfe\n\n",
        b"1 2 3 4 5 6\n\n",
        b"x",
        b"data: " + bytes(range(256)) * 300 + b"\n\n",  # 77 KB
        b"id: 7\r\ndata: %d %s\r\n\r\n",
    ]
    store = RedisStore(redis.url)
    try:
        logs = [store.open(f"o{i}", "c") for i in range(3)]
        for event in odd:
            for i, log in enumerate(logs):
                log.append(event + b"%d" % i)
        await written(store)
        for i in range(3):
            entries = await store.client.xrange(PREFIX + f"o{i}")
            assert [fields[b"e"] for _, fields in entries] == [e + b"%d" % i for e in odd]
    finally:
        await store.aclose()
