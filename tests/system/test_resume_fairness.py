"""Resumable streams no one reads do not hold the sidecar from the streams that are read.

With `--resume`, a client that leaves does not cancel its upstream: the stream goes on into
the store, every event given an id and stored, in Python. An upstream far faster than any
model (here the emulator with no pause between tokens, in its own process) fills each read
with up to 256 KB of events; taken in at once for each of many such streams, that held the
sidecar's loop for seconds, and a new stream's first event waited behind it (5.8 s of the 7 s
the streams ran, with this test, before the fix). Sliced (`Relay._slices`), a loop turn holds a
slice per stream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from tests.support.clients import request
from tests.support.procs import CHAT, Child, chat, free_port, get
from tests.support.servers import wait_listening

STREAMS = 64  # read for READING_S, then left
READING_S = 2.0
TOKENS = 20_000  # each: seconds of the sidecar's CPU, all of them together


async def first_event(port: int) -> float:
    """Seconds from a new connection to the first event of a one-token stream."""
    started = time.monotonic()
    response = await request(port, "POST", CHAT, body=chat(1, 0))
    try:
        assert response.status == 200
        data = await response.chunk()
        assert data is not None and b"\nid: " in data, data  # stamped: a resumable stream
        return time.monotonic() - started
    finally:
        response.close()


def emulator_process(port: int) -> subprocess.Popen[bytes]:
    """The emulator in a process of its own: it sends on the other core, as an upstream does."""
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
    )


async def generating(emulator: int) -> int:
    """Streams the emulator is sending."""
    _, _, body = await get(emulator, "/debug/stats")
    return int(json.loads(body)["streams_active"])


async def until(count: Any, reached: int) -> None:
    """Wait (at most 60 s) until `count()` is `reached`: up to it, or down to it when 0."""
    for _ in range(1200):
        now = await count()
        if (now == 0) if reached == 0 else (now >= reached):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached: {reached}")


async def test_a_new_stream_is_not_held_behind_fast_resumable_streams() -> None:
    """Rule: while 64 resumable streams go on at an upstream's full speed, read by clients as
    fast as they come for 2 s and then left (their streams go on into the store), a new
    stream's first event comes within a small share of the time they take to finish (each
    probe below a fifth of it), not after them."""
    emulator_port = free_port()
    emulator = emulator_process(emulator_port)
    child = load = None
    try:
        await wait_listening(emulator_port)
        child = Child(emulator_port, "--resume")
        await child.ready()
        await first_event(child.port)  # the upstream pool and the code paths, warmed
        config = {"port": child.port, "concurrency": STREAMS, "duration": READING_S}
        config |= {"tokens": TOKENS, "itl_ms": 0}
        load = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.loadgen", json.dumps(config),
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        started = time.monotonic()
        await until(lambda: generating(emulator_port), STREAMS)
        probes: list[float] = []
        while await generating(emulator_port) >= STREAMS // 2 and time.monotonic() - started < 60:
            probes.append(await first_event(child.port))
        await until(lambda: generating(emulator_port), 0)
        finished = time.monotonic() - started
        assert await load.wait() == 0
    finally:
        if load is not None and load.returncode is None:
            load.kill()
            await load.wait()
        if child is not None:
            child.kill()
        emulator.kill()
        emulator.wait()
    assert len(probes) >= 3, f"the streams finished in {finished:.1f} s: too soon to probe"
    assert max(probes) < finished / 5, (probes, finished)
