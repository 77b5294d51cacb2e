"""How long the admin's live view takes with many streams in flight: `python -m
bench.lab.live_view [STREAMS]` opens that many streams through a StreamGuard (telemetry on,
driven by hand, `tests/support/inflight.py`) and times `streams_view.snapshot` (and its JSON)
at the default bound and at ?limit=10."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from sidecar.streams_view import snapshot
from tests.support.inflight import open_streams


async def main(count: int) -> None:
    release = asyncio.Event()
    registry, tasks = await open_streams(count, release)
    try:
        for limit in (100, 10):
            runs = 20
            start = time.perf_counter()
            for _ in range(runs):
                body = json.dumps(snapshot(registry, limit))
            elapsed = (time.perf_counter() - start) / runs
            print(f"{count} in flight, limit {limit}: {elapsed * 1000:.2f} ms, {len(body)} bytes")
    finally:
        release.set()
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
