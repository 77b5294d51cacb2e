"""Resume on a Redis Cluster: sidecar processes (`--resume-store redis+cluster://…`) share a
real three-node cluster (`redis-server --cluster-enabled yes`, `redis-cli --cluster create`:
`tests/support/redis_procs.py`). A stream's keys share a hash tag, so streams spread over the
nodes; a slot moved between nodes mid-stream (ASK while it migrates, MOVED after) and a node
restarted empty mid-stream leave every stream whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from middleware.resume.redis_batch import Batches
from middleware.resume.redis_connect import connect
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat
from tests.support.redis import store_flags
from tests.support.redis_procs import cluster_group, until
from tests.support.servers import serve
from tests.support.sseparse import parse
from tests.system.test_resume_sentinel import assert_whole, events_until, resumed

TOKENS, ITL_MS = 1200, 25  # 30 s a stream: it outlasts a slot's move, a restart, a repair
STREAMS = 9  # all on one of three nodes: one chance in 3**8


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def key(stream_id: str) -> str:
    return f"sidestream:resume:{{{stream_id}}}"


async def cut_streams(port: int, count: int) -> tuple[list[str], list[list[tuple[Any, ...]]]]:
    """`count` streams started on `port`, each read to its 5th event and cut there."""
    ids, heads = [], []
    for _ in range(count):
        response = await request(port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
        stream_id = response.header("sidestream-stream-id")
        assert stream_id
        heads.append(parse(await events_until(response, 5))[:5])
        response.close()  # its generation goes on into the store (the grace period)
        ids.append(stream_id)
    return ids, heads


async def on_node(port: int, *command: Any) -> Any:
    """`command` on the node on `port`, preceded by ASKING (so an importing node answers for
    a slot it is taking over)."""
    node = aioredis.Redis(port=port, single_connection_client=True)
    try:
        await node.execute_command("ASKING")
        return await node.execute_command(*command)
    finally:
        await node.aclose()


async def test_streams_spread_over_the_nodes_and_resume_through_a_slot_moved_mid_stream(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: with a cluster store, a stream's keys share one slot and different streams land
    on different nodes; a slot moved to another node mid-stream (the producer's writes
    answered ASK while it migrates, the other replica's reads MOVED after) loses nothing:
    each reader cut on one sidecar resumes on the other with every event once, in order; the
    live reader is whole; one upstream request each."""
    upstream, stats = emulator
    async with cluster_group() as group:
        flags = ("--resume", *store_flags(group.url), "--resume-grace", "30")
        a, b = Child(upstream, *flags), Child(upstream, *flags)
        live = None
        try:
            await a.ready()
            await b.ready()
            live = await request(a.port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
            live_id = live.header("sidestream-stream-id")
            assert live_id
            live_body = asyncio.create_task(asyncio.wait_for(live.body(), 60))
            ids, heads = await cut_streams(a.port, STREAMS)
            owners = [await group.owner(key(stream_id)) for stream_id in ids]
            for stream_id, port in zip(ids, owners, strict=True):  # its keys on its slot's node
                found = await on_node(port, "EXISTS", key(stream_id), key(stream_id) + ":m")
                assert found == 2, stream_id

            moved = key(ids[0])
            to = next(port for port in group.ports if port != owners[0])

            async def asked() -> None:  # writes reach the new node while the slot migrates
                start = await on_node(to, "XLEN", moved)

                async def grew() -> bool:
                    return int(await on_node(to, "XLEN", moved)) > start

                await until(grew, 25, "the producer's writes following ASK")

            await group.move_slot(moved, to, asked)
            assert await group.owner(moved) == to
            tails = await asyncio.gather(*(resumed(b.port, s, 5) for s in ids))
            live_events = parse(await live_body)
        finally:
            if live is not None:  # also when the test failed: its socket is not left open
                live.close()
            a.kill()
            b.kill()
    assert len(set(owners)) > 1, owners
    assert_whole(live_id, live_events, TOKENS)
    for stream_id, head, tail in zip(ids, heads, tails, strict=True):
        assert_whole(stream_id, head + tail, TOKENS)
    assert stats.streams_started == STREAMS + 1


async def test_a_node_restarted_mid_stream_gives_a_clear_error_then_a_whole_resume(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: while the node holding a stream's slot is down, a reader resuming it gets a
    clear answer (`503 resume_store_unavailable`, or a terminal event), never a hang; the
    live reader is never cut; once the node is back (restarted empty), the producer writes
    back what it lost and a reader cut before resumes on the other sidecar with every event
    once, in order."""
    upstream, stats = emulator
    async with cluster_group() as group:
        flags = ("--resume", *store_flags(group.url), "--resume-grace", "30")
        a, b = Child(upstream, *flags), Child(upstream, *flags)
        live = None
        try:
            await a.ready()
            await b.ready()
            live = await request(a.port, "POST", CHAT, body=chat(TOKENS, ITL_MS))
            live_id = live.header("sidestream-stream-id")
            assert live_id
            live_body = asyncio.create_task(asyncio.wait_for(live.body(), 60))
            (cut_id,), (head,) = await cut_streams(a.port, 1)
            node = await group.owner(key(cut_id))
            group.stop(node)
            headers = [("Last-Event-ID", f"{cut_id}:5")]
            during = await request(b.port, "POST", CHAT, body=chat(TOKENS, ITL_MS), headers=headers)
            try:
                body = await asyncio.wait_for(during.body(), 30)
                status = during.status
            finally:
                during.close()
            group.restart(node)
            await group.settled()

            async def restored() -> int:
                return int(await on_node(node, "EXISTS", key(cut_id) + ":m"))

            await until(restored, 10, "the producer restoring the stream")
            tail = await resumed(b.port, cut_id, 5)
            live_events = parse(await live_body)
        finally:
            if live is not None:  # also when the test failed: its socket is not left open
                live.close()
            a.kill()
            b.kill()
    if status == 200:  # attached before the node was missed: its reader ended with the error
        assert b"resume_store_unavailable" in body, body
    else:
        assert status == 503 and b"resume_store_unavailable" in body, (status, body)
    assert_whole(live_id, live_events, TOKENS)
    assert_whole(cut_id, head + tail, TOKENS)
    assert stats.streams_started == 2


async def test_a_write_answered_ask_lands_on_the_importing_node_over_pooled_connections() -> None:
    """Rule: a store command answered ASK while its slot migrates is sent again to the
    importing node after ASKING on the same connection, also when the client holds several
    connections to that node (redis-py's own redirect sends ASKING on one and the command on
    another: the node answers MOVED, back and forth until redis-py gives up)."""
    async with cluster_group() as group:
        client = connect(group.url)
        batches = Batches(client, cluster=True)
        try:
            moved = key("ask")
            await client.xadd(moved, {"e": "1"}, id="1-1")
            source = await group.owner(moved)
            to = next(port for port in group.ports if port != source)
            names = [key(str(n)) for n in range(64)]
            served = [name for name in names if await group.owner(name) == to][:4]
            await asyncio.gather(*(client.exists(name) for name in served * 2))  # a pool to `to`
            replies = []

            async def writes() -> None:
                for n in range(2, 6):
                    replies.extend(await batches.run([("XADD", moved, f"{n}-1", "e", str(n))]))

            await group.move_slot(moved, to, writes)
            assert replies == [f"{n}-1".encode() for n in range(2, 6)], replies
            assert await on_node(to, "XLEN", moved) == 5
        finally:
            await batches.aclose()
            await client.aclose()
