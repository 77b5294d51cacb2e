"""Request trailers cost the sidecar no memory it keeps (issue 56, item 2): a sidecar process
(`python -m sidecar`, its collector at its default thresholds, nothing collecting by hand)
takes connections that each try to send tens of MiB of trailers; its RSS (from /proc) is
back within a few MiB of where it was once they are closed.

Before the fix, 500 MB of trailers on one connection took the sidecar from 41 to 821 MiB in
0.6 s, and the memory stayed after the connection closed (held in reference cycles until a
full collection)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.procs import CHAT, Child
from tests.support.servers import serve
from tests.support.upstreams import EchoUpstream

MiB = 1024 * 1024
ATTEMPT = 32 * MiB  # trailer bytes each connection tries to send
CONNECTIONS = 10
SLACK = 16 * MiB  # allocator noise; the attack, unbounded, is CONNECTIONS * ATTEMPT
BOUND = 10.0  # seconds the connections and the settling may take


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    async with serve(EchoUpstream()) as port:
        yield port


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


HEAD = b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


async def send_trailers(port: int, field: bool) -> int:
    """One connection's attempt: a chat body, then trailers (one field that never ends, or
    many small ones) a MiB per write, until the sidecar closes; the bytes it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    piece = b"a" * MiB if field else b"X-A: bbbbbbbbbbbbbbbb\r\n" * (MiB // 23)
    sent = 0
    try:
        writer.write(HEAD + b"2\r\n{}\r\n0\r\n" + (b"X-Big: " if field else b""))
        with contextlib.suppress(ConnectionError):
            while sent < ATTEMPT and not reader.at_eof():
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
            await reader.read()  # the sidecar's 431, then its close
    finally:
        writer.close()
    return sent


async def attack(port: int, connections: int) -> list[int]:
    return await asyncio.gather(*(send_trailers(port, i % 2 == 0) for i in range(connections)))


async def settled(pid: int, ceiling: int) -> int:
    """The sidecar's RSS once it is under `ceiling`, or the last reading after BOUND."""
    for _ in range(int(BOUND / 0.05)):
        now = rss(pid)
        if now <= ceiling:
            return now
        await asyncio.sleep(0.05)
    return rss(pid)


@pytest.mark.parametrize("flags", [(), ("--http2",)], ids=["uvicorn", "hypercorn"])
async def test_rss_is_back_near_baseline_after_big_trailer_connections_close(
    upstream: int, flags: tuple[str, ...]
) -> None:
    """Ten connections each try 32 MiB of trailers (half as one field that never ends, half
    as many fields): each is closed after at most `--max-header-bytes` and a read, and the
    sidecar's RSS afterwards is within 16 MiB of its RSS before them (the attack, held,
    would be 320 MiB)."""
    child = Child(upstream, *flags)
    try:
        await child.ready()
        pid = child.process.pid
        await asyncio.wait_for(attack(child.port, 2), BOUND)
        before = rss(pid)  # after a first round: the allocator has its working set
        taken = await asyncio.wait_for(attack(child.port, CONNECTIONS), BOUND)
        after = await settled(pid, before + SLACK)
    finally:
        child.kill()
    assert after - before <= SLACK, f"RSS grew {(after - before) / MiB:.1f} MiB"
    assert max(taken) < ATTEMPT, "a connection was let send every byte it tried"
