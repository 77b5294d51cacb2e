"""The live view is bounded: with 5,000 streams in flight through a StreamGuard, a snapshot
lists MAX_ENTRIES of them, the longest without a chunk first, and the total of 5,000. How
long that takes is measured by `bench/lab/live_view.py`, not asserted here."""

from __future__ import annotations

import asyncio
import json

from sidecar.streams_view import MAX_ENTRIES, snapshot
from tests.support.inflight import open_streams

STREAMS = 5000


async def test_5000_streams_list_at_most_max_entries_oldest_silence_first() -> None:
    """5,000 in flight: total 5,000, MAX_ENTRIES entries, sorted by time since the last chunk
    (all from the earlier half), and the JSON stays small."""
    release = asyncio.Event()
    registry, tasks = await open_streams(STREAMS, release)
    try:
        view = snapshot(registry)
        small = snapshot(registry, 10)
    finally:
        release.set()
        await asyncio.gather(*tasks)
    assert view["total"] == STREAMS and len(view["streams"]) == MAX_ENTRIES
    gaps = [s["since_last_chunk_s"] for s in view["streams"]]
    assert gaps == sorted(gaps, reverse=True)
    assert all(int(s["request_id"][1:]) < STREAMS // 2 for s in view["streams"])
    assert all(s["tokens"] == 1 and s["model"] == "m" for s in view["streams"])
    assert len(small["streams"]) == 10 and small["total"] == STREAMS
    assert len(json.dumps(view)) < 40_000
    assert len(registry) == 0
