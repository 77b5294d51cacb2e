"""`--header-timeout` on the `--http2` listener (hypercorn): a client that never completes a
request head is closed in time, on h2c and on HTTP/1.1 alike, however it trickles bytes;
a request that is complete is not cut, however long its stream lasts.

The sidecar's timeout is 0.5 s; hypercorn's own keep-alive default is 5 s, so each bound
below (3 s) fails when the setting does not reach hypercorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator

import h2.config
import h2.connection
import pytest

from middleware.guard import StreamGuard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.proxy import ProxyApp
from sidecar.servers.hypercorn_listener import HypercornListener
from tests.support.clients import request
from tests.support.servers import bound_socket, serve, wait_listening

HEADER_TIMEOUT = 0.5
BOUND = 3.0


@contextlib.asynccontextmanager
async def h2_sidecar(upstream_port: int) -> AsyncIterator[int]:
    settings = load(
        [
            "--http2",
            "--upstream", f"http://127.0.0.1:{upstream_port}",
            "--header-timeout", str(HEADER_TIMEOUT),
            "--keepalive-interval", "off",
        ],
        {},
    )  # fmt: skip
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    guard = StreamGuard(ProxyApp(settings.upstream), keepalive_interval=None)
    listener = HypercornListener(guard, settings, sock)
    task = asyncio.create_task(listener.serve())
    try:
        await wait_listening(port)
        yield port
    finally:
        listener.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as upstream, h2_sidecar(upstream) as port:
        yield port


def preface() -> bytes:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return conn.data_to_send()


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


async def closed_after(port: int, sent: bytes, trickle: bytes) -> float:
    """Connect, send `sent`, then `trickle` one byte every 100 ms (a client that keeps the
    connection busy without finishing anything); seconds until the sidecar closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()

    async def drip() -> None:
        writer.write(sent)
        for byte in trickle:
            await asyncio.sleep(0.1)
            writer.write(bytes([byte]))

    dripping = asyncio.create_task(drip())
    try:
        async with asyncio.timeout(BOUND):
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
        return time.monotonic() - start
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await dripping
        writer.close()


SLOW_HEADERS = frame(0x1, 0x0, 1, b"\x82\x86")  # HEADERS without END_HEADERS
SLOW_CONTINUATION = frame(0x9, 0x0, 1, b"\x84" * 40)  # never completes: trickled


@pytest.mark.parametrize(
    ("sent", "trickle"),
    [
        (b"", b""),  # connects and sends nothing
        (b"", preface()),  # the h2c preface and SETTINGS, byte by byte
        (preface() + SLOW_HEADERS, SLOW_CONTINUATION),  # a header block never ended
        (b"", b"GET / HTTP/1.1\r\nhost: x\r\n" + b"x-slow: " + b"a" * 60),  # HTTP/1.1 slowloris
    ],
    ids=["silent", "slow-preface", "headers-never-end", "http1-slow-head"],
)
async def test_a_request_head_not_complete_in_time_is_closed(
    port: int, sent: bytes, trickle: bytes
) -> None:
    """A connection with no complete request head is closed about `--header-timeout` after
    it opened, even while bytes keep arriving (reads never extend the deadline)."""
    took = await closed_after(port, sent, trickle)
    assert HEADER_TIMEOUT * 0.8 <= took < BOUND


async def test_a_stream_longer_than_the_header_timeout_is_not_cut(port: int) -> None:
    """The deadline ends with the request head: a stream running four times as long as
    `--header-timeout` completes."""
    response = await request(port, "GET", "/v1/stream?ttft_ms=0&itl_ms=100&tokens=20")
    async with asyncio.timeout(20):
        body = await response.body()
    response.close()
    assert response.status == 200 and body.rstrip().endswith(b"data: [DONE]")
