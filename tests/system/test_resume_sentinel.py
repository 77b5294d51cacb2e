"""Resume through a Redis failover: sidecar processes (`--resume-store redis+sentinel://…`)
share a real Sentinel group (a primary, a replica, three sentinels: `tests/support/
redis_procs.py`); the primary is killed with SIGKILL mid-stream. And the mechanism that
keeps such a stream whole: a Redis that lost every write (restarted empty on its port) gets
what it lacks re-appended by the producing replica."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from middleware.resume.redis import PREFIX
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat, free_port
from tests.support.redis import store_flags
from tests.support.redis_procs import answers, sentinel_group, start_redis, until
from tests.support.servers import serve
from tests.support.sseparse import parse

TOKENS, ITL_MS = 300, 25  # 7.5 s a stream: it outlasts a failover (about 3 s here)


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


async def events_until(response: Any, count: int) -> bytes:
    body = b""
    while len(parse(body)) < count:
        chunk = await response.chunk()
        assert chunk is not None, body
        body += chunk
    return body


async def resumed(port: int, stream_id: str, after: int) -> list[tuple[Any, ...]]:
    """The events a reader resuming `stream_id` after event `after` on `port` reads."""
    headers = [("Last-Event-ID", f"{stream_id}:{after}")]
    response = await request(port, "POST", CHAT, body=chat(TOKENS, ITL_MS), headers=headers)
    try:
        body = await asyncio.wait_for(response.body(), 60)
        assert response.status == 200, body
        return parse(body)
    finally:
        response.close()


def assert_whole(stream_id: str, events: list[tuple[Any, ...]], tokens: int) -> None:
    """Events 1…N of the stream, each once and in order, the content tokens all there, and
    the stream's own end."""
    assert [e[2] for e in events] == [f"{stream_id}:{n}" for n in range(1, len(events) + 1)]
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(e[1])["choices"] for e in events[:-1]]
    assert sum(1 for c in chunks if c and c[0]["delta"].get("content")) == tokens


async def store_failures(child: Child) -> int:
    metrics = await request(child.admin, "GET", "/metrics")
    text = (await metrics.body()).decode()
    metrics.close()
    line = next(x for x in text.splitlines() if x.startswith("sidestream_resume_store_fail"))
    return int(float(line.split()[-1]))


async def test_a_sentinel_failover_mid_stream_keeps_every_stream_whole(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: with the primary SIGKILLed mid-stream and a replica promoted by the sentinels,
    the live reader gets every event to the end; a reader cut before the failover resumes
    on the other replica after it, with every event once, in order, no gap in the ids; a
    stream started after the failover resumes across replicas too; one upstream request
    each."""
    upstream, stats = emulator
    async with sentinel_group() as group:
        flags = ("--resume", *store_flags(group.url), "--resume-grace", "30")
        a, b = Child(upstream, *flags), Child(upstream, *flags)
        try:
            await a.ready()
            await b.ready()
            live = await request(a.port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
            cut = await request(a.port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
            live_id, cut_id = (
                live.header("sidestream-stream-id"),
                cut.header("sidestream-stream-id"),
            )
            assert live_id and cut_id
            head = parse(await events_until(cut, 5))[:5]
            cut.close()  # its generation goes on into the store (the grace period)
            live_head = await events_until(live, 5)
            group.primary.kill()
            live_rest = asyncio.create_task(asyncio.wait_for(live.body(), 60))
            await group.failed_over()
            tail = await resumed(b.port, cut_id, 5)
            live_events = parse(live_head + await live_rest)
            live.close()

            after = await request(b.port, "POST", CHAT, body=chat(40, 10))
            after_id = after.header("sidestream-stream-id")
            assert after_id
            after_head = parse(await events_until(after, 3))[:3]
            after.close()
            after_tail = await resumed(a.port, after_id, 3)
        finally:
            a.kill()
            b.kill()
    assert_whole(live_id, live_events, TOKENS)
    assert_whole(cut_id, head + tail, TOKENS)
    assert_whole(after_id, after_head + after_tail, 40)
    assert stats.streams_started == 3


async def test_what_a_restarted_redis_lost_is_re_appended_by_the_producer(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: when Redis loses writes the producer made (the extreme case: restarted empty,
    as a failover loses the writes not yet replicated), the producing replica re-appends
    what Redis lacks once it answers again, without duplicating: a reader cut before then
    resumes on another replica with every event once, in order, no gap in the ids."""
    upstream, stats = emulator
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    redis = start_redis(port)
    try:
        await answers(port)
        flags = ("--resume", *store_flags(url), "--resume-grace", "30")
        a, b = Child(upstream, *flags), Child(upstream, *flags)
        try:
            await a.ready()
            await b.ready()
            first = await request(a.port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
            stream_id = first.header("sidestream-stream-id")
            assert stream_id
            head = parse(await events_until(first, 5))[:5]
            first.close()
            redis.kill()
            redis.wait()

            async def noticed() -> bool:  # the producer's writes failed: it knows
                return await store_failures(a) > 0

            await until(noticed, 20, "the producer seeing Redis gone")
            redis = start_redis(port)  # empty: every key of the stream is gone
            await answers(port)
            client = aioredis.Redis(port=port)
            try:  # the producer retries once a second: the stream is back within a second

                async def restored() -> int:
                    return int(await client.exists(f"{PREFIX}{stream_id}:m"))

                await until(restored, 10, "the producer restoring the stream")
            finally:
                await client.aclose()
            tail = await resumed(b.port, stream_id, 5)
        finally:
            a.kill()
            b.kill()
    finally:
        redis.kill()
        redis.wait()
    assert_whole(stream_id, head + tail, TOKENS)
    assert stats.streams_started == 1
