"""A resume request's cursor on the Redis store: XREAD after the last entry it has, entry by
entry, so that a reader never gets a hole in the ids: an entry past the one due (trimmed
while it was behind, or lost by a failover and not re-appended) ends it with `410` instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from middleware.resume.redis_connect import ERRORS
from middleware.resume.redis_keys import REFRESH_SECONDS, REPLICA
from middleware.resume.store import LOST, ResumeGap, ResumePointGone, StoreUnavailable

READER_MS = 5000  # a reader's key lives this long unless refreshed
BLOCK_MS = 1000  # one XREAD waits this long at most


class RedisReader:
    """One resume request's cursor: XREAD after the last entry it has."""

    __slots__ = (
        "client", "cursor", "failed", "key", "link", "next", "origin", "point", "refreshed",
        "replica",
    )  # fmt: skip

    def __init__(
        self,
        client: Any,
        failed: Callable[[BaseException], object],
        key: str,
        after: int,
        meta: dict[str, str],
    ) -> None:
        self.origin = meta.get("o", "")
        self.link = meta.get("t", "")
        self.replica = meta.get("r", "")
        self.client = client
        self.failed = failed  # the store's: counted, logged, and what Redis lost restored
        self.key = key  # the stream's (`redis_keys.Keys`)
        self.cursor = f"{after}-1" if after else "0-0"
        self.refreshed = 0.0
        self.point = after  # -1 once an entry came; until then XREAD may be past the end
        self.next = after + 1  # the entry due next: a later one means a hole (below)

    async def read(self, timeout: float | None) -> tuple[list[bytes], bool]:
        client, key = self.client, self.key
        loop = asyncio.get_running_loop()
        block = BLOCK_MS if timeout is None else int(min(timeout, BLOCK_MS / 1000) * 1000)
        try:
            if loop.time() - self.refreshed > REFRESH_SECONDS:
                self.refreshed = loop.time()
                await client.set(f"{key}:r", b"1", px=READER_MS)
            last = self.point >= 0 and await client.xrevrange(key, "+", "-", count=1)
            if last and b"end" in last[0][1] and int(last[0][0].split(b"-")[0]) <= self.point:
                return [], True  # at or past the last event of a finished stream: its end, now
            reply = await client.xread({key: self.cursor}, block=max(block, 1))
            if not reply:
                if not await client.exists(REPLICA + self.replica):
                    return [_upstream_gone()], True
                return [], False
        except ERRORS as exc:
            self.failed(exc)
            raise StoreUnavailable() from exc
        self.point = -1  # the end entry now lies after the cursor: XREAD returns it
        events: list[bytes] = []
        for entry_id, fields in reply[0][1]:
            number = int(entry_id.split(b"-")[0])
            if number > self.next:
                # Events trimmed while this reader was behind, or lost by a failover and not
                # re-appended (the producer died too): the events before the hole, then 410.
                if not events:
                    raise ResumePointGone()
                return events, False
            self.next = number + 1
            if b"end" in fields:
                self.cursor = entry_id.decode()
                return events, True
            event = fields[b"e"]
            if event == LOST:  # the events before it, then (next read) the end of this reader
                if not events:
                    raise ResumeGap()
                return events, False
            self.cursor = entry_id.decode()
            events.append(event)
        return events, False

    def close(self) -> None:
        pass


def _upstream_gone() -> bytes:
    error = {
        "message": "the replica producing this stream is gone",
        "type": "upstream_error",
        "code": "upstream_error",
    }
    return b"data: " + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n\n"
