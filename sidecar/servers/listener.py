"""What the sidecar needs of a server, whichever one serves the port."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Listener(Protocol):
    """Serve until told to exit: uvicorn.Server's three flags and `serve()`."""

    should_exit: bool
    force_exit: bool
    started: bool

    async def serve(self) -> None: ...


class ExitEvent:
    """`should_exit` kept as an asyncio.Event, so serving can wait for it instead of polling;
    setting it True sets the event (once set it stays set, as a stop cannot be taken back)."""

    _exit: asyncio.Event

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
