"""`/readyz` and an unreachable resume store: a sidecar process with a Redis store, the
redis-server killed and restarted on its port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.admin import STORE_UNREACHABLE
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat, free_port, get
from tests.support.redis import store_flags
from tests.support.redis_procs import answers, start_redis, until
from tests.support.servers import serve
from tests.support.sseparse import parse
from tests.system.test_resume_sentinel import assert_whole, events_until, resumed


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


async def readiness(child: Child) -> tuple[int, Any]:
    status, _, body = await get(child.admin, "/readyz")
    return status, json.loads(body)


async def test_readyz_names_an_unreachable_store_stays_ready_and_resume_comes_back(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: with the Redis store unreachable, `/readyz` stays 200 (resume is optional) and
    its detail says the store is unreachable, with no stream needed to notice; streams run;
    once Redis is back the detail is `ok` again by itself and a stream cut on the sidecar
    resumes, every event once, in order."""
    upstream, stats = emulator
    port = free_port()
    redis = start_redis(port)
    child = Child(upstream, "--resume", *store_flags(f"redis://127.0.0.1:{port}/0"))
    try:
        await answers(port)
        await child.ready()

        async def is_ok() -> bool:
            return await readiness(child) == (200, {"status": "ok", "detail": "ok"})

        await until(is_ok, 10, "readiness with the store up")
        redis.kill()
        redis.wait()

        async def names_store() -> Any:
            status, body = await readiness(child)
            return (status, body) if STORE_UNREACHABLE in body["detail"] else None

        down = await until(names_store, 10, "the detail naming the store")
        status, _, body = await get(child.port, CHAT, "POST", chat(5, 0))
        streamed = parse(body)

        redis = start_redis(port)
        await answers(port)
        await until(is_ok, 10, "readiness once the store is back")
        first = await request(child.port, "POST", CHAT, body=chat(40, 20))
        stream_id = first.header("sidestream-stream-id")
        assert stream_id
        head = parse(await events_until(first, 3))[:3]
        first.close()
        tail = await resumed(child.port, stream_id, 3)
    finally:
        child.kill()
        redis.kill()
        redis.wait()
    assert down == (200, {"status": "ok", "detail": f"ok; {STORE_UNREACHABLE}"})
    assert status == 200 and streamed[-1][1] == "[DONE]"
    assert_whole(stream_id, head + tail, 40)
    assert stats.streams_started == 2
