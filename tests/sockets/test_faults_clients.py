"""Dying clients: FIN, RST or half-close at every phase cancel the upstream and leave nothing behind.

Each test warms the sidecar up with one complete request (so its pool holds an idle upstream
connection), takes a baseline of asyncio tasks, open file descriptors and the upstream's
open and busy connections, lets one client die at the phase under test, then waits (at most
a few seconds, polling) for every count to come back to the baseline.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from middleware.errors import Outcome
from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from tests.support.clients import connection, read_response, request
from tests.support.faulty import FaultyUpstream, record_outcomes
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
SETTLE_SECONDS = 3.0


@pytest.fixture
def outcomes() -> Iterator[list[Outcome]]:
    with record_outcomes() as recorded:
        yield recorded


def counts(upstream: FaultyUpstream) -> dict[str, int]:
    return {
        "tasks": len(asyncio.all_tasks()),
        "fds": len(os.listdir("/proc/self/fd")),
        "upstream_open": upstream.open,
        "upstream_busy": upstream.busy,
    }


async def settled(upstream: FaultyUpstream, baseline: dict[str, int]) -> dict[str, int]:
    """The counts once none is above its baseline, or as they are after SETTLE_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_SECONDS
    while True:
        now = counts(upstream)
        if all(now[k] <= baseline[k] for k in baseline) or loop.time() > deadline:
            return now
        await asyncio.sleep(0.01)


def head(pacing: str = "", length: int = len(BODY)) -> bytes:
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{pacing}\r\n"
    ).encode()


async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, how: str) -> None:
    if how == "rst":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
    elif how == "fin":
        writer.close()
    else:  # half-close: no more requests, but still reading; the server decides what follows
        writer.transport.write_eof()
        try:
            async with asyncio.timeout(SETTLE_SECONDS):
                while await reader.read(65536):
                    pass
        finally:
            writer.close()


async def wait_for(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError("the condition did not become true within 5 s")


@pytest.mark.parametrize("how", ["fin", "rst", "half_close"])
@pytest.mark.parametrize("phase", ["request_body", "first_token", "mid_stream", "keep_alive"])
async def test_dying_client_cancels_the_upstream_and_leaks_nothing(
    outcomes: list[Outcome], how: str, phase: str
) -> None:
    """A client dying at any phase cancels its upstream request; tasks, fds and upstream
    connections return to their baseline, and the request has exactly one outcome."""
    # Forced usage reads a chat request's body whole before the upstream sees it; `pass`
    # streams it, so that a client dying mid-body has an upstream request to cancel.
    usage = ["--usage", "pass"] if phase == "request_body" else []
    async with FaultyUpstream() as upstream:
        settings = load(["--upstream", f"http://127.0.0.1:{upstream.port}", *usage], environ={})
        async with serve(build_guard(settings, StreamRegistry()), "sidecar") as port:
            warm = await request(port, "POST", CHAT, body=BODY, headers=[("X-Fault-Tokens", "2")])
            await warm.body()
            warm.close()
            await asyncio.sleep(0.05)
            baseline = counts(upstream)
            assert baseline["upstream_busy"] == 0 and baseline["upstream_open"] == 1

            async with connection(port) as (reader, writer):
                requests = upstream.requests
                if phase == "request_body":
                    writer.write(head(length=2 * len(BODY)) + BODY)  # half of the promised body
                    await wait_for(lambda: upstream.busy == 1)
                elif phase == "first_token":
                    writer.write(head("X-Fault-TTFT-Ms: 60000\r\n") + BODY)
                    response = await read_response(reader, writer)
                    assert response.status == 200
                    await wait_for(lambda: upstream.busy == 1)
                elif phase == "mid_stream":
                    writer.write(head("X-Fault-Tokens: 100000\r\n") + BODY)
                    response = await read_response(reader, writer)
                    for _ in range(3):
                        assert await response.chunk()
                    assert upstream.busy == 1
                else:
                    writer.write(head("X-Fault-Tokens: 3\r\n") + BODY)
                    response = await read_response(reader, writer)
                    await response.body()
                    await asyncio.sleep(0.05)  # idle on a kept-alive connection
                    assert upstream.busy == 0
                assert upstream.requests == requests + 1
                await die(reader, writer, how)
            after = await settled(upstream, baseline)
    assert after["upstream_busy"] == 0, "the upstream request was not cancelled"
    assert all(after[k] <= baseline[k] for k in baseline), (baseline, after)
    expected = Outcome.COMPLETED if phase == "keep_alive" else Outcome.CLIENT_DISCONNECTED
    assert outcomes == [Outcome.COMPLETED, expected]
