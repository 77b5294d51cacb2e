"""Resume across replicas: two sidecar processes (`--resume --resume-store redis://…`) share
one real `redis-server` started here on a free port, in front of the emulator, which counts
the generation requests it receives."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat, free_port
from tests.support.redis import RedisServer, store_flags
from tests.support.servers import serve
from tests.support.sseparse import parse


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


async def replicas(upstream: int, redis: RedisServer, count: int = 2) -> list[Child]:
    children = [
        Child(upstream, "--resume", *store_flags(redis.url), "--resume-grace", "10")
        for _ in range(count)
    ]
    for child in children:
        await child.ready()
    return children


async def events_until(response: Any, count: int) -> bytes:
    body = b""
    while len(parse(body)) < count:
        chunk = await response.chunk()
        assert chunk is not None, body
        body += chunk
    return body


async def test_a_stream_started_on_a_resumes_on_b_exactly_once(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: a stream started through replica A whose client dropped resumes through replica B
    (`Last-Event-ID`): events k+1… exactly once, in order, to the end; one upstream request."""
    upstream, stats = emulator
    a, b = await replicas(upstream, redis)
    try:
        first = await request(a.port, "POST", CHAT, body=chat(40, 10))
        stream_id = first.header("sidestream-stream-id")
        assert stream_id is not None
        head = parse(await events_until(first, 4))[:4]
        first.close()
        rest = await request(
            b.port, "POST", CHAT, body=chat(40, 10), headers=[("Last-Event-ID", f"{stream_id}:4")]
        )
        tail = parse(await rest.body())
        rest.close()
        assert rest.status == 200
    finally:
        a.kill()
        b.kill()
    events = head + tail
    assert [e[2] for e in events] == [f"{stream_id}:{n}" for n in range(1, len(events) + 1)]
    assert events[-1][1] == "[DONE]"
    tokens = [json.loads(e[1])["choices"] for e in events[:-1]]
    assert sum(1 for c in tokens if c and c[0]["delta"].get("content")) == 40
    assert stats.streams_started == 1


async def test_killing_the_producing_replica_ends_remote_readers_within_5s(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: if the producing replica dies (SIGKILL), a reader on another replica gets a
    terminal `upstream_error` event within 5 s; it never hangs."""
    upstream, _ = emulator
    a, b = await replicas(upstream, redis)
    try:
        first = await request(a.port, "POST", CHAT, body=chat(2000, 20))
        stream_id = first.header("sidestream-stream-id")
        await events_until(first, 3)
        reader = await request(b.port, "GET", f"/sidestream/v1/streams/{stream_id}?after=2")
        await events_until(reader, 3)
        a.process.kill()
        killed = time.monotonic()
        body = await asyncio.wait_for(reader.body(), 8)
        elapsed = time.monotonic() - killed
        reader.close()
        first.close()
    finally:
        a.kill()
        b.kill()
    assert json.loads(parse(body)[-1][1])["error"]["code"] == "upstream_error"
    assert elapsed < 5.0


async def test_redis_killed_mid_stream_the_stream_completes_and_resume_gets_503(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: the store never breaks a live stream: Redis killed mid-stream, the stream still
    completes; a resume then gets 503 resume_store_unavailable."""
    upstream, _ = emulator
    (a,) = await replicas(upstream, redis, 1)
    try:
        first = await request(a.port, "POST", CHAT, body=chat(60, 10))
        stream_id = first.header("sidestream-stream-id")
        await events_until(first, 5)
        redis.kill()
        events = parse(await first.body())
        first.close()
        assert events[-1][1] == "[DONE]"
        again = await request(a.port, "GET", f"/sidestream/v1/streams/{stream_id}?after=1")
        error = json.loads(await again.body())
        again.close()
        metrics = await request(a.admin, "GET", "/metrics")
        text = (await metrics.body()).decode()
        metrics.close()
    finally:
        a.kill()
    assert again.status == 503 and error["error"]["code"] == "resume_store_unavailable"
    failures = [line for line in text.splitlines() if line.startswith("sidestream_resume_store_fa")]
    assert failures and int(failures[0].split()[-1]) >= 1


async def test_redis_keys_expire_after_the_ttl(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: a finished stream's Redis keys carry the `--resume-ttl` expiry and are gone after
    it (a resume then gets 404)."""
    import redis.asyncio as aioredis

    upstream, _ = emulator
    child = Child(upstream, "--resume", *store_flags(redis.url), "--resume-ttl", "1")
    client = aioredis.from_url(redis.url)
    try:
        await child.ready()
        response = await request(child.port, "POST", CHAT, body=chat(5, 0))
        await response.body()
        response.close()
        stream_id = response.header("sidestream-stream-id")
        keys = [f"sidestream:resume:{stream_id}", f"sidestream:resume:{stream_id}:m"]
        deadline = time.monotonic() + 5
        while await client.exists(*keys) < 2:  # the batched write may be a moment behind
            assert time.monotonic() < deadline, "keys never written"
            await asyncio.sleep(0.01)
        ttls = [await client.pttl(k) for k in keys]
        assert all(0 < ttl <= 1000 for ttl in ttls), ttls
        while await client.exists(*keys):
            assert time.monotonic() < deadline, "keys did not expire"
            await asyncio.sleep(0.05)
        gone = await request(child.port, "GET", f"/sidestream/v1/streams/{stream_id}")
        await gone.body()
        gone.close()
    finally:
        await client.aclose()
        child.kill()
    assert gone.status == 404


async def test_redis_unreachable_at_start_is_a_warning_not_an_exit(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: a Redis store that cannot be reached at start is not an exit (a warning): streams
    flow, named and stamped, and a resume gets 503 resume_store_unavailable."""
    upstream, _ = emulator
    nothing = free_port()
    child = Child(upstream, "--resume", *store_flags(f"redis://127.0.0.1:{nothing}/0"))
    try:
        await child.ready()
        response = await request(child.port, "POST", CHAT, body=chat(5, 0))
        events = parse(await response.body())
        response.close()
        stream_id = response.header("sidestream-stream-id")
        again = await request(child.port, "GET", f"/sidestream/v1/streams/{stream_id}")
        error = json.loads(await again.body())
        again.close()
        assert child.process.poll() is None
    finally:
        child.kill()
    assert events[-1][1] == "[DONE]" and events[0][2] == f"{stream_id}:1"
    assert again.status == 503 and error["error"]["code"] == "resume_store_unavailable"


async def test_a_reader_on_b_keeps_the_stream_alive_past_a_grace(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: the grace period counts readers on every replica: with A's client gone and a
    reader attached on B, A goes on generating past `--resume-grace`, to the end."""
    upstream, stats = emulator
    flags = ("--resume", *store_flags(redis.url), "--resume-grace", "0.5")
    a, b = Child(upstream, *flags), Child(upstream, *flags)
    try:
        await a.ready()
        await b.ready()
        first = await request(a.port, "POST", CHAT, body=chat(120, 20))
        stream_id = first.header("sidestream-stream-id")
        await events_until(first, 3)
        reader = await request(b.port, "GET", f"/sidestream/v1/streams/{stream_id}?after=3")
        await events_until(reader, 2)
        first.close()
        events = parse(await asyncio.wait_for(reader.body(), 10))
        reader.close()
    finally:
        a.kill()
        b.kill()
    assert events[-1][1] == "[DONE]" and stats.streams_cancelled == 0


async def test_delete_on_b_stops_the_stream_produced_on_a(
    emulator: tuple[int, Stats], redis: RedisServer
) -> None:
    """Rule: DELETE on any replica stops the stream where it is produced: 204, A's upstream
    cancelled, and readers on both replicas end with a terminal `cancelled` event."""
    upstream, stats = emulator
    a, b = await replicas(upstream, redis)
    try:
        first = await request(a.port, "POST", CHAT, body=chat(2000, 20))
        stream_id = first.header("sidestream-stream-id")
        await events_until(first, 3)
        reader = await request(b.port, "GET", f"/sidestream/v1/streams/{stream_id}?after=1")
        await events_until(reader, 2)
        stop = await request(b.port, "DELETE", f"/sidestream/v1/streams/{stream_id}")
        await stop.body()
        stop.close()
        bodies = [
            await asyncio.wait_for(first.body(), 5),
            await asyncio.wait_for(reader.body(), 5),
        ]
        first.close()
        reader.close()
    finally:
        a.kill()
        b.kill()
    assert stop.status == 204 and stats.streams_cancelled == 1
    for body in bodies:
        assert json.loads(parse(body)[-1][1])["error"]["code"] == "cancelled"
