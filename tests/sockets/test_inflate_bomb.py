"""A compressed upstream body through a sidecar process: inflated in bounded steps at the
reader's pace, and a compression bomb refused (issue 56, item 3).

The upstream is a raw server that sends `Content-Encoding: gzip` `text/event-stream` bodies
no matter what was asked (the sidecar asks for `identity`); the sidecar is a child process,
so that its memory is its own: the rise of its peak RSS (VmHWM, from /proc) over a stream
is what the stream cost it. Each test runs with the compiled core and the Python one.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from middleware.speedups import DISABLE
from middleware.stream_response import INFLATE_RATIO_AFTER, INFLATE_STEP
from tests.support.clients import request
from tests.support.procs import Child, get
from tests.support.sseparse import parse
from tests.support.upstreams import RawConnection, RawUpstream

MiB = 1024 * 1024
GiB = 1024 * MiB
# What one stream may add to the sidecar's peak RSS: a piece, a compressed read, the
# server's write buffer and the allocator's slack; the body inflates to 1 GiB and 256 MiB.
BOUND = 32 * MiB
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime


def gzip_repeated(head: bytes, block: bytes, count: int, tail: bytes) -> bytes:
    """The gzip of `head + block * count + tail`, made without compressing `count` blocks:
    each part is deflated after a full flush (nothing refers back past it), so the block's
    deflated bytes, repeated, inflate to the block repeated."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = packer.compress(head) + packer.flush(zlib.Z_FULL_FLUSH)
    middle = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    assert again == middle, "a full flush makes each block's bytes the same"
    last = packer.compress(tail) + packer.flush()
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    size = len(head) + count * len(block) + len(tail)
    trailer = struct.pack("<II", zlib.crc32(tail, crc), size & 0xFFFFFFFF)
    return GZIP_HEADER + first + middle * count + last + trailer


def dense_block() -> bytes:
    """1 MiB of `data:` lines that deflate ~300x: under the ratio limit, yet 1 MB of it
    inflates to ~300 MB."""
    rnd, lines, size = random.Random(56), [], 0
    while size < MiB:
        lines.append(b"data: " + rnd.randbytes(4).hex().encode() + b"a" * 4000 + b"\n\n")
        size += len(lines[-1])
    return b"".join(lines)


WARM = gzip_repeated(b"", b"data: warm\n\n" * 1000, 1, b"")
BOMB = gzip_repeated(b"data: ", b"a" * MiB, 1024, b"\n\n")  # ~1 MB that inflates to 1 GiB
DENSE_BLOCK = dense_block()
DENSE = gzip_repeated(b"", DENSE_BLOCK, 256, b"")  # inflates to ~256 MiB, ~300x


async def answer(connection: RawConnection) -> None:
    """Every request on the connection: a gzip SSE body by path (`/warm`, `/bomb`, `/dense`)."""
    bodies = {b"/warm": WARM, b"/bomb": BOMB, b"/dense": DENSE}
    while head := await connection.read_head():
        body = bodies[head.split(b" ", 2)[1]]
        connection.writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
        )
        await connection.writer.drain()


def peak_rss(pid: int) -> int:
    """The process's peak resident set so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(params=["compiled", "python"])
async def sidecar(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Child]:
    """A sidecar process (the core named by the param) in front of the gzip upstream, warmed
    up by one compressed stream."""
    monkeypatch.setenv(DISABLE, "1" if request.param == "python" else "0")
    async with RawUpstream(answer).running() as upstream:
        child = Child(upstream.port)
        try:
            await child.ready()
            status, _, body = await get(child.port, "/warm")
            assert status == 200 and body == b"data: warm\n\n" * 1000
            yield child
        finally:
            child.kill()


async def outcomes(child: Child) -> str:
    """The sidecar's stream outcome counters, once the last stream has been counted."""
    for _ in range(100):
        _, _, text = await get(child.admin, "/metrics")
        lines = [
            line
            for line in text.decode().splitlines()
            if line.startswith("sidestream_streams_total")
        ]
        if len(lines) > 1:  # the warm-up's, and this stream's
            return "\n".join(lines)
        await asyncio.sleep(0.02)
    raise AssertionError("the stream was never counted")


async def test_a_gzip_bomb_ends_with_a_terminal_error_and_bounded_memory(sidecar: Child) -> None:
    """Rule: a 1 MB gzip SSE body that inflates to 1 GiB reaches the client as at most a
    little over `INFLATE_RATIO_AFTER` bytes, then one terminal error event
    (`compression_ratio_exceeded`), outcome `upstream_error`; the sidecar's peak RSS rises by
    less than BOUND (inflated whole, it took ~800 MiB)."""
    before = peak_rss(sidecar.process.pid)
    async with asyncio.timeout(30):
        response = await request(sidecar.port, "GET", "/bomb")
        try:
            body = await response.body()
        finally:
            response.close()
    rise = peak_rss(sidecar.process.pid) - before
    assert rise < BOUND, f"peak RSS rose {rise / MiB:.1f} MiB"
    assert response.status == 200
    assert INFLATE_RATIO_AFTER <= len(body) < INFLATE_RATIO_AFTER + 2 * INFLATE_STEP
    error = json.loads(parse(body)[-1][1])["error"]
    assert error["code"] == "compression_ratio_exceeded"
    assert 'sidestream_streams_total{sidestream_outcome="upstream_error"} 1' in await outcomes(
        sidecar
    )


async def test_a_dense_body_under_the_limit_inflates_at_the_readers_pace(sidecar: Child) -> None:
    """Rule: a body under the ratio limit is relayed whole, byte for byte, inflated a bounded
    step at a time as the reader takes it: 1 MB that inflates to 256 MiB (each upstream read
    to ~80 MiB) raises the sidecar's peak RSS by less than BOUND while the reader takes 64 MiB."""
    before = peak_rss(sidecar.process.pid)
    got, size = [], 0
    async with asyncio.timeout(30):
        response = await request(sidecar.port, "GET", "/dense")
        try:
            while size < 64 * MiB and (data := await response.chunk()) is not None:
                got.append(data)
                size += len(data)
            rise = peak_rss(sidecar.process.pid) - before
        finally:
            response.close()
    assert response.status == 200
    assert size >= 64 * MiB
    assert b"".join(got)[: 64 * MiB] == (DENSE_BLOCK * 64)[: 64 * MiB]
    assert rise < BOUND, f"peak RSS rose {rise / MiB:.1f} MiB"
