"""A request body has its own deadline, `--body-timeout` (issue 56, item 7), and forced
usage holds no more of a chat body than `--max-body` allows.

The sidecar is what `python -m sidecar` builds, on both traffic listeners (uvicorn with the
traffic protocol; hypercorn with `--http2`), in front of the recording upstream of
`test_request_trailers`. Clients are raw sockets that send a body one byte at a time, the
attack: with `--max-streams 1`, one such client shut everyone else out until the first-token
timeout (300 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from middleware.registry import StreamRegistry
from tests.sockets.test_request_trailers import (
    BOUND,
    CHAT,
    FIRST_CHUNK,
    LISTENERS,
    OTHER,
    Recorder,
    answer,
    chunked_head,
    sidecar,
)
from tests.support.clients import connection

BODY_TIMEOUT = 0.5


@pytest.fixture
async def upstream() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    async with recorder.raw.running():
        yield recorder


async def trickle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, piece: bytes
) -> bytes:
    """Send `piece` every 0.1 s until the sidecar answers (or 4 body timeouts have passed):
    the answer's first byte, or b"" for none."""
    for _ in range(int(4 * BODY_TIMEOUT / 0.1)):
        with contextlib.suppress(ConnectionError):
            writer.write(piece)
        with contextlib.suppress(TimeoutError):  # the trickle's pace, and its end
            return await asyncio.wait_for(reader.read(1), 0.1)
    return b""


async def slot_freed(registry: StreamRegistry) -> None:
    """Return once the sidecar holds no request (within BOUND)."""
    for _ in range(int(BOUND / 0.01)):
        if len(registry) == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(registry)} requests still held")


def error_code(data: bytes) -> str:
    code: str = json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"]
    return code


@pytest.mark.parametrize("path", [CHAT, OTHER], ids=["forced-usage-path", "plain-path"])
@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_trickling_body_gets_408_and_frees_its_slot(
    upstream: Recorder, listener: str, path: bytes
) -> None:
    """A body sent one byte at a time gets 408 `request_timeout` once `--body-timeout` has
    passed since its head (forced usage's read of a chat body included), the connection is
    closed, and its `--max-streams` slot is free: the next request is served."""
    registry = StreamRegistry()
    flags = ("--body-timeout", str(BODY_TIMEOUT), "--max-streams", "1")
    async with sidecar(listener, upstream.raw.port, *flags, registry=registry) as port:
        async with connection(port) as (reader, writer):
            writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{" % path)
            first = await trickle(reader, writer, b" ")
            assert first, "no answer within four body timeouts"
            status, data = await answer(reader, first)
        assert status == 408 and error_code(data) == "request_timeout"
        await slot_freed(registry)
        async with connection(port) as (reader, writer):
            writer.write(chunked_head(OTHER) + FIRST_CHUNK + b"0\r\n\r\n")
            served = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), BOUND)
    assert served.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("listener", LISTENERS)
async def test_trailers_trickled_without_end_get_408(upstream: Recorder, listener: str) -> None:
    """Trailers are part of the body's time: a chunked body whose trailer fields keep coming,
    each small, never ending the block, gets 408 at `--body-timeout` like any slow body."""
    flags = ("--body-timeout", str(BODY_TIMEOUT))
    async with (
        sidecar(listener, upstream.raw.port, *flags) as port,
        connection(port) as (reader, writer),
    ):
        writer.write(chunked_head(CHAT) + FIRST_CHUNK + b"0\r\n")
        first = await trickle(reader, writer, b"X-A: b\r\n")
        assert first, "no answer within four body timeouts"
        status, data = await answer(reader, first)
    assert status == 408 and error_code(data) == "request_timeout"
    assert upstream.requests == []


@pytest.mark.parametrize(
    "head",
    [
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" % CHAT,
        chunked_head(CHAT) + b"%x\r\n%s\r\n" % (1500, b" " * 1500),
    ],
    ids=["declared-length", "chunked"],
)
@pytest.mark.parametrize("listener", LISTENERS)
async def test_forced_usage_holds_no_more_than_max_body(
    upstream: Recorder, listener: str, head: bytes
) -> None:
    """Forced usage reads a chat body before the proxy counts it: it reads none of a body
    whose Content-Length is past `--max-body`, and stops a chunked one there, so the client
    gets its 413 while it is still sending, not once the whole body (up to 1 MiB) is in or
    the body's deadline falls (60 s here)."""
    async with (
        sidecar(listener, upstream.raw.port, "--max-body", "1000") as port,
        connection(port) as (reader, writer),
    ):
        writer.write(head)
        status, data = await answer(reader)
    assert status == 413 and error_code(data) == "request_too_large"
    assert upstream.requests == []
