"""The servers' main loop: uvicorn's `Server` without its signal handlers (`QuietServer`,
both paths) and without its poll of `should_exit` (`EventServer`, behind the gate)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn

from sidecar.servers.listener import ExitEvent


class QuietServer(ExitEvent, uvicorn.Server):
    """uvicorn without its own signal handlers: the Sidecar decides what a signal means. Its
    main loop is uvicorn's own, which polls `should_exit` (the public path's server)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        self._up = asyncio.Event()
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class EventServer(QuietServer):
    """`QuietServer` without uvicorn's 10 Hz poll of `should_exit`: the main loop waits on
    the event the flag sets, so an idle sidecar is never woken (the wake-ups of two polling
    servers showed up in benchmark windows). uvicorn's tick also refreshes the date header
    once a second; the sidecar sends none."""

    async def main_loop(self) -> None:
        # One tick sets the default headers (none: no date, no server header); uvicorn's other
        # per-tick duty, `limit_max_requests`, is never configured by the sidecar.
        await self.on_tick(0)
        await self._exit.wait()
