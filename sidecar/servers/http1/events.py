"""What a connection and its requests wait on: the connection's flow control (`Flow`) and an
event whose waiter list is made at the first wait (`LazyEvent`). uvicorn's design (its
`FlowControl`, an `asyncio.Event` per request), in lighter objects: why, `protocol`'s
docstring.
"""

from __future__ import annotations

import asyncio
from typing import Literal

# A request body buffered past this many bytes, not yet read by its app, pauses reading
# (uvicorn's figure: its `HIGH_WATER_LIMIT`).
HIGH_WATER_LIMIT = 65536


class LazyEvent:
    """An `asyncio.Event`'s `set`, `clear`, `is_set` and `wait`, with the waiter list made at
    the first `wait()`: an `asyncio.Event` makes a deque at once, and most of these events
    are never waited on."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for waiter in self._waiters or ():
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> Literal[True]:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)


class Flow:
    """A connection's flow control: reading paused while a request's body waits for its app
    or a pipelined request waits its turn; writing paused while the transport holds more
    than its high-water mark (`pause_writing`/`resume_writing` from the transport), which
    `drain()` waits out."""

    # `write_paused` is read per chunk by the `send_nowait` write: a slot, read in place by
    # the compiled one (sidecar/_core.c's `slot_of`).
    __slots__ = ("_transport", "_writable", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        # What `drain()` waits on, made at the first pause: most connections never pause.
        self._writable: LazyEvent | None = None

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable.wait()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            if self._writable is None:
                self._writable = LazyEvent()
            else:
                self._writable.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            if self._writable is not None:
                self._writable.set()
