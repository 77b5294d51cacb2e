"""What the sidecar needs of a server, whichever one serves the port."""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol


class Listener(Protocol):
    """Serve a bound, listening socket until told to exit: uvicorn.Server's three flags,
    `serve(sockets)`, and a wait for `started`."""

    should_exit: bool
    force_exit: bool
    started: bool

    async def serve(self, sockets: list[socket.socket] | None = None) -> None: ...

    async def wait_started(self) -> None: ...


class ExitEvent:
    """`should_exit` and `started` kept as asyncio.Events, so the sidecar can wait for them
    instead of polling; setting either True sets its event (once set it stays set: a stop
    cannot be taken back, nor can a start)."""

    _exit: asyncio.Event
    _up: asyncio.Event

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()

    @property
    def started(self) -> bool:
        return self._up.is_set()

    @started.setter
    def started(self, value: bool) -> None:
        if value:
            self._up.set()

    async def wait_started(self) -> None:
        await self._up.wait()
