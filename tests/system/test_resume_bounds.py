"""Bounds under load: a sidecar process with `--resume` (memory store) serves 1,000
resumable streams; its RSS (from /proc) stays within the configured memory bound plus slack."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat
from tests.support.servers import serve

MiB = 1024 * 1024


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def run_streams(port: int, count: int, concurrency: int = 50) -> list[str]:
    ids: list[str] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await request(port, "POST", CHAT, body=chat(150, 0))
            try:
                await response.body()
            finally:
                response.close()
            ids.append(response.header("sidestream-stream-id") or "")

    await asyncio.gather(*(one() for _ in range(count)))
    return ids


async def test_rss_stays_within_the_memory_bound_over_1000_streams(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: the memory store holds at most `--resume-memory` bytes in all: 1,000 streams of
    ~36 KB each (36 MB unbounded) grow the sidecar's RSS by less than the 4 MiB bound plus
    8 MiB of slack, and the oldest finished streams are gone (404) while the newest resume."""
    upstream, _ = emulator
    child = Child(upstream, "--resume", "--resume-memory", str(4 * MiB))
    try:
        await child.ready()
        await run_streams(child.port, 100)  # warm up: allocator, pools, code paths
        before = rss(child.process.pid)
        ids = await run_streams(child.port, 900)
        after = rss(child.process.pid)
        old = await request(child.port, "GET", f"/sidestream/v1/streams/{ids[0]}")
        await old.body()
        old.close()
        new = await request(child.port, "GET", f"/sidestream/v1/streams/{ids[-1]}?after=100")
        await new.body()
        new.close()
    finally:
        child.kill()
    assert all(ids)
    assert after - before < 12 * MiB, f"RSS grew {(after - before) / MiB:.1f} MiB"
    assert old.status == 404 and new.status == 200
