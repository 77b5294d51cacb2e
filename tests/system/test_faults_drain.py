"""Drain under load: SIGTERM with 200 streams in flight ends each one cleanly, then the process.

The sidecar is a real child process (`tests.support.procs.Child`) in front of the
emulator, which runs in the test's own loop and tells when all 200 streams are in flight.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator

import pytest

from sidecar.emulator import Stats, make_app
from tests.support.procs import CHAT, Child, chat, get
from tests.support.servers import serve
from tests.support.sseparse import parse

STREAMS = 200
DRAIN_TIMEOUT = 2.0


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats), backlog=1024) as port:
        yield port, stats


async def test_sigterm_with_200_streams_ends_every_one_with_done_or_a_retryable_event(
    emulator: tuple[int, Stats],
) -> None:
    """SIGTERM, 200 streams in flight: each ends with [DONE] or `shutting_down` and a clean
    chunked end; /readyz is 503 at once, new requests 503; exit 0 within drain-timeout + 1 s."""
    upstream, stats = emulator
    child = Child(upstream, "--drain-timeout", str(DRAIN_TIMEOUT), "--keepalive-interval", "0.5")
    try:
        await child.ready()
        # Half finish well inside the drain timeout, half would run for minutes.
        bodies = [chat(5, 200) if n % 2 else chat(1000, 200) for n in range(STREAMS)]
        streams = [asyncio.ensure_future(get(child.port, CHAT, "POST", b)) for b in bodies]
        for _ in range(1000):
            if stats.streams_started == STREAMS:
                break
            await asyncio.sleep(0.01)
        assert stats.streams_started == STREAMS and stats.streams_completed == 0
        started = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        ready_status, _, _ = await get(child.admin, "/readyz")
        ready_after = time.monotonic() - started
        new_status, new_headers, new_body = await get(child.port, CHAT, "POST", chat(5, 0))
        code = await child.exit_code(timeout=DRAIN_TIMEOUT + 3)
        exited_after = time.monotonic() - started
        results = await asyncio.gather(*streams, return_exceptions=True)
    finally:
        child.kill()
    assert ready_status == 503 and ready_after < 0.5
    assert new_status == 503 and new_headers["retry-after"] == "1"
    assert json.loads(new_body)["error"]["code"] == "shutting_down"
    ends = []
    for result in results:
        assert not isinstance(result, BaseException), f"a stream was cut: {result!r}"
        status, _, body = result
        assert status == 200
        last = parse(body)[-1][1]
        ends.append("done" if last == "[DONE]" else json.loads(last)["error"]["code"])
    assert ends.count("done") == STREAMS // 2
    assert ends.count("shutting_down") == STREAMS // 2
    assert code == 0
    assert exited_after < DRAIN_TIMEOUT + 1.0


async def test_second_sigterm_with_200_streams_ends_them_all_at_once(
    emulator: tuple[int, Stats],
) -> None:
    """A second SIGTERM mid-drain ends all 200 streams retryably and the process at once."""
    upstream, stats = emulator
    child = Child(upstream, "--drain-timeout", "60")
    try:
        await child.ready()
        streams = [
            asyncio.ensure_future(get(child.port, CHAT, "POST", chat(1000, 200)))
            for _ in range(STREAMS)
        ]
        for _ in range(1000):
            if stats.streams_started == STREAMS:
                break
            await asyncio.sleep(0.01)
        child.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert child.process.poll() is None  # still draining
        started = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        code = await child.exit_code(timeout=5)
        exited_after = time.monotonic() - started
        results = await asyncio.gather(*streams, return_exceptions=True)
    finally:
        child.kill()
    assert code == 0 and exited_after < 2.0
    for result in results:
        assert not isinstance(result, BaseException), f"a stream was cut: {result!r}"
        status, _, body = result
        assert status == 200
        assert json.loads(parse(body)[-1][1])["error"]["code"] == "shutting_down"
