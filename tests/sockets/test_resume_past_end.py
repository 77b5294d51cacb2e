"""A resume point at or past a stream's last event, on both stores: the sidecar (`--resume`) on
uvicorn in front of the emulator, with the memory store and with a real `redis-server`, each
resumed by `Last-Event-ID` and by `GET /sidestream/v1/streams/<id>?after=<n>`.

The rule, the same on both stores: a finished stream answers a point at or past its last
event at once with `200 text/event-stream` and no event, only the end of the body (the
stream's end); a point past the last event of a running stream waits for that event, and
ends when the stream ends short of it, which the stream's idle timeout bounds.

The keep-alive interval is 5 s: a store that waited before answering writes `: keep-alive`
first, and one that never answers is caught by the bound on each read (`asyncio.timeout`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from middleware.registry import StreamRegistry
from middleware.resume import Resume
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import RawResponse, request
from tests.support.redis import store_flags
from tests.support.servers import serve
from tests.support.sseparse import parse

CHAT = "/v1/chat/completions"
JSON = [("Content-Type", "application/json")]
HANG = 30.0  # a reader that has not ended by then never will: the test fails, not hangs


def chat(tokens: int, itl_ms: int) -> bytes:
    pacing = {"tokens": tokens, "itl_ms": itl_ms, "ttft_ms": 0}
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps(
        {"model": "m", "stream": True, "messages": messages, "sidestream": pacing}
    ).encode()


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The sidecar's store flags: the memory store, or a throwaway redis-server's."""
    if request.param == "memory":
        return ()
    return store_flags(request.getfixturevalue("redis").url)


@pytest.fixture(params=["last-event-id", "after"])
def how(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sidecar(store: tuple[str, ...]) -> AsyncIterator[tuple[int, Stats]]:
    """The sidecar's port (keep-alive every 5 s, idle timeout 1 s) and the emulator's stats."""
    stats = Stats()
    async with serve(make_app(stats=stats)) as upstream:
        flags = ["--upstream", f"http://127.0.0.1:{upstream}", "--resume", *store]
        flags += ["--keepalive-interval", "5", "--idle-timeout", "1"]
        guard = build_guard(load(flags, environ={}), StreamRegistry(), None)
        try:
            async with serve(guard, "sidecar") as port:
                yield port, stats
        finally:
            assert isinstance(guard.resume, Resume)
            await guard.resume.store.aclose()  # a Redis store's connections and tasks


async def resume(port: int, how: str, stream_id: str, after: int) -> RawResponse:
    if how == "last-event-id":
        return await request(port, "GET", CHAT, headers=[("Last-Event-ID", f"{stream_id}:{after}")])
    return await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after={after}")


async def whole(response: RawResponse) -> bytes:
    try:
        async with asyncio.timeout(HANG):
            return await response.body()
    finally:
        response.close()


async def events_until(response: RawResponse, count: int) -> bytes:
    body = b""
    async with asyncio.timeout(HANG):
        while len(parse(body)) < count:
            chunk = await response.chunk()
            assert chunk is not None, body
            body += chunk
    return body


def assert_end_only(response: RawResponse, body: bytes, *, at_once: bool) -> None:
    """200 SSE with no event; `at_once`: not even a keep-alive came before the end."""
    assert response.status == 200
    assert (response.header("content-type") or "").startswith("text/event-stream")
    assert parse(body) == []
    if at_once:
        assert body == b"", body


async def test_a_finished_stream_answers_a_point_at_or_past_its_end_at_once(
    sidecar: tuple[int, Stats], how: str
) -> None:
    """Rule: for a finished stream, a resume point at its last event, one past it and far
    past it each get 200 with no event and the end at once (no keep-alive first, no hang),
    on either store, by `Last-Event-ID` and by `?after=`; none reaches the upstream."""
    port, stats = sidecar
    first = await request(port, "POST", CHAT, body=chat(3, 0), headers=JSON)
    stream_id = first.header("sidestream-stream-id")
    last = len(parse(await whole(first)))
    assert stream_id is not None and last >= 5  # role, 3 tokens, finish, [DONE]
    started = stats.streams_started
    for after in (last, last + 1, last + 1000):
        response = await resume(port, how, stream_id, after)
        assert_end_only(response, await whole(response), at_once=True)
    before = await resume(port, how, stream_id, last - 1)  # the store still holds the end
    assert [e[2] for e in parse(await whole(before))] == [f"{stream_id}:{last}"]
    assert stats.streams_started == started


async def test_a_running_stream_makes_a_point_past_its_last_event_wait_for_it(
    sidecar: tuple[int, Stats], how: str
) -> None:
    """Rule: on a running stream, a point past the last event so far waits for the events
    after it and then the end; a point past the stream's final event gets the end when the
    stream ends (no event), on either store, by `Last-Event-ID` and by `?after=`."""
    port, _ = sidecar
    first = await request(port, "POST", CHAT, body=chat(12, 250), headers=JSON)
    stream_id = first.header("sidestream-stream-id")
    assert stream_id is not None
    try:
        await events_until(first, 2)  # role and first token; the 12th token is ~2.5 s away
        ahead = await resume(port, how, stream_id, 10)
        beyond = await resume(port, how, stream_id, 1000)
        rest = await whole(first)
    finally:
        first.close()
    total = 2 + len(parse(rest))
    ahead_ids = [e[2] for e in parse(await whole(ahead))]
    assert ahead.status == 200
    assert ahead_ids == [f"{stream_id}:{n}" for n in range(11, total + 1)]
    assert_end_only(beyond, await whole(beyond), at_once=False)


async def test_a_point_past_the_end_of_a_stalled_stream_ends_with_its_idle_timeout(
    sidecar: tuple[int, Stats], how: str
) -> None:
    """Rule: a reader past the last event of a stream whose upstream stalls is not held
    forever: the stream's idle timeout (1 s) ends it, and the reader gets the end then, on
    either store, by `Last-Event-ID` and by `?after=`."""
    port, _ = sidecar
    first = await request(port, "POST", CHAT, body=chat(3, 600_000), headers=JSON)
    stream_id = first.header("sidestream-stream-id")
    assert stream_id is not None
    try:
        await events_until(first, 2)  # role and first token, then nothing for 10 minutes
        beyond = await resume(port, how, stream_id, 1000)
        events = parse(await whole(first))
    finally:
        first.close()
    assert json.loads(events[-1][1])["error"]["code"] == "idle_timeout"
    assert_end_only(beyond, await whole(beyond), at_once=False)
