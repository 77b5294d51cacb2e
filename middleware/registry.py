"""The process-wide set of in-flight requests, for load shedding and graceful drain."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Drainable(Protocol):
    def shut_down(self) -> None:
        """End this request now with a retryable terminal event (or a 503 before headers)."""


class StreamRegistry:
    """Counts in-flight requests and drains them.

    One registry is shared by every request a StreamGuard serves. Adding and removing a
    request is a set operation; nothing here runs per chunk.
    """

    def __init__(self) -> None:
        self._active: set[Drainable] = set()
        self._empty: asyncio.Event | None = None
        self.draining = False

    def __len__(self) -> int:
        return len(self._active)

    def requests(self) -> list[Drainable]:
        """The requests in flight now, as a list (a cold path: the admin's live view)."""
        return list(self._active)

    def add(self, request: Drainable) -> None:
        self._active.add(request)

    def discard(self, request: Drainable) -> None:
        self._active.discard(request)
        if not self._active and self._empty is not None:
            self._empty.set()

    async def wait_empty(self, timeout: float | None) -> bool:
        """Wait until nothing is in flight; False if `timeout` passed first."""
        if not self._active:
            return True
        if self._empty is None or self._empty.is_set():
            self._empty = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await self._empty.wait()
        except TimeoutError:
            return False
        return True

    async def drain(self, timeout: float, grace: float = 5.0) -> None:
        """Refuse new requests, let in-flight ones run up to `timeout`, then end the rest.

        The rest end with a retryable terminal event; `grace` bounds how long they may take
        to write it.
        """
        self.draining = True
        if await self.wait_empty(timeout):
            return
        self.shut_down_all()
        await self.wait_empty(grace)

    def shut_down_all(self) -> None:
        """End every in-flight request now with a retryable terminal event."""
        self.draining = True
        for request in list(self._active):
            request.shut_down()
