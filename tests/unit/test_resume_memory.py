"""The memory store's bounds (`middleware.resume.memory`): per stream, in total, and ttl."""

from __future__ import annotations

import asyncio

import pytest

from middleware.resume.memory import MemoryStore
from middleware.resume.store import Limits, ResumePointGone, StreamNotFound


async def test_total_memory_stays_within_the_bound_over_1000_streams() -> None:
    """Rule: past `memory` the oldest finished streams are evicted (resume: 404), past
    `max_bytes` a stream's oldest events go (resume from before them: 410); the bytes held
    never pass `memory`."""
    store = MemoryStore(Limits(max_bytes=4000, memory=200_000, ttl=60))
    event = b"data: " + b"x" * 94 + b"\n\n"
    peak = 0
    for i in range(1000):
        log = store.open(f"stream{i:012d}", "")
        for _ in range(60):
            log.append(event)
            peak = max(peak, store.used)
        log.end(b"", "completed")
    assert peak <= 200_000 and store.used <= 200_000
    assert 0 < len(store.streams) < 1000
    with pytest.raises(StreamNotFound):
        await store.attach("stream000000000000", 0, "")
    with pytest.raises(ResumePointGone):
        await store.attach("stream000000000999", 0, "")
    reader = await store.attach("stream000000000999", 59, "")
    assert await reader.read(0) == ([event], True)
    reader = await store.attach("stream000000000999", 60, "")
    assert await reader.read(0) == ([], True)
    await store.aclose()
    assert store.used == 0


async def test_a_finished_stream_expires_after_its_ttl() -> None:
    """Rule: a finished stream stays resumable for `ttl` seconds, then is gone (404)."""
    store = MemoryStore(Limits(ttl=0.05))
    log = store.open("s" * 22, "")
    log.append(b"data: a\n\n")
    log.end(b"", "completed")
    await store.attach("s" * 22, 0, "")
    for _ in range(200):
        if "s" * 22 not in store.streams:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(StreamNotFound):
        await store.attach("s" * 22, 0, "")
