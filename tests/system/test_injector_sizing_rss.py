"""The injector's memory rule on a real sidecar process: with the settings it injects for a
80Mi memory limit, 200 streams and the memory resume store, the process's peak RSS (VmHWM,
from /proc) stays under 80Mi while the store is filled past its bound and every stream the
limit allows is open at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.emulator import Stats, make_app
from sidecar.injector import parse_settings
from sidecar.injector.sizing import MiB, memory_bytes
from tests.support.clients import request
from tests.support.procs import CHAT, Child
from tests.support.servers import serve

LIMIT = "80Mi"
STREAMS = 200
FLAGS = {  # the injected env -> the same setting as a flag
    "SIDESTREAM_MAX_STREAMS": "--max-streams",
    "SIDESTREAM_RESUME_MEMORY": "--resume-memory",
}


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def body(tokens: int, itl_ms: int, text: str = "") -> bytes:
    pacing = f'"tokens": {tokens}, "ttft_ms": 0, "itl_ms": {itl_ms}'
    if text:
        pacing += f', "text": "{text}"'
    return (
        '{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], '
        f'"sidestream": {{{pacing}}}}}'
    ).encode()


async def fill(port: int, count: int, concurrency: int = 40) -> list[str]:
    """`count` streams of ~100 KB each (250 events of ~400 bytes), read to the end."""
    ids: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    word = "x" * 300

    async def one() -> None:
        async with gate:
            response = await request(port, "POST", CHAT, body=body(250, 0, word))
            try:
                await response.body()
            finally:
                response.close()
            ids.append(response.header("sidestream-stream-id") or "")

    await asyncio.gather(*(one() for _ in range(count)))
    return ids


async def test_injected_memory_settings_keep_a_full_store_and_every_stream_under_the_limit(
    emulator: int,
) -> None:
    """Rule: memory-limit >= 64 MiB + 16 KiB x max-streams + the store's bound / 0.75. The
    injector lowers the memory store's bound to fit (here from the sidecar's 256 MiB), and a
    sidecar run with exactly those settings, its store pushed to ~60 MB of events (past the
    bound: the oldest streams are gone) and then holding all 200 streams open, peaks below
    the limit. Without the lowered bound the store alone would pass it."""
    settings, _ = parse_settings(
        {
            "sidestream.dev/upstream-port": "8000",
            "sidestream.dev/memory-limit": LIMIT,
            "sidestream.dev/max-streams": str(STREAMS),
            "sidestream.dev/resume": "true",
        }
    )
    env = {e["name"]: e["value"] for e in settings.env() if "value" in e}
    assert env["SIDESTREAM_RESUME"] == "true"
    flags = ["--resume"]
    for name, flag in FLAGS.items():
        flags += [flag, str(env[name])]
    bound = int(env["SIDESTREAM_RESUME_MEMORY"])
    limit = memory_bytes(LIMIT)
    assert limit is not None and 8 * MiB <= bound < limit // 2
    child = Child(emulator, *flags)
    held: list[asyncio.Task[None]] = []
    try:
        await child.ready()
        ids = await fill(child.port, 600)
        opened = asyncio.Event()
        count = 0

        async def hold() -> None:
            nonlocal count
            response = await request(child.port, "POST", CHAT, body=body(2, 4000))
            count += 1
            if count == STREAMS:
                opened.set()
            try:
                await response.body()
            finally:
                response.close()

        held = [asyncio.create_task(hold()) for _ in range(STREAMS)]
        await asyncio.wait_for(opened.wait(), 30)  # every stream's headers are in
        peak = peak_rss(child.process.pid)
        await asyncio.gather(*held)
        first = await request(child.port, "GET", f"/sidestream/v1/streams/{ids[0]}")
        await first.body()
        first.close()
    finally:
        for task in held:
            task.cancel()
        child.kill()
    assert all(ids)
    assert peak < limit, f"peak RSS {peak / MiB:.1f} MiB is over the {LIMIT} limit"
    assert first.status == 404, "the store never reached its bound: the test proves nothing"
