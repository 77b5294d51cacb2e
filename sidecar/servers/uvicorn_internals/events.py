"""The lighter stand-ins for what uvicorn makes per connection and per request: the
protocol's `pipeline` (`Pipeline`) and `flow` (`Flow`), and each cycle's `message_event`
(`LazyEvent`), with the methods uvicorn calls of them (why: `protocol`'s docstring).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from uvicorn.protocols.http.flow_control import FlowControl


class LazyEvent:
    """What uvicorn calls of an `asyncio.Event` (`set`, `clear`, `is_set`, `wait`), with the
    waiter list made at the first `wait()`: an `asyncio.Event` makes a deque at once."""

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


class Pipeline(list[Any]):
    """uvicorn's queue of pipelined requests, of which it calls `appendleft`, `pop` and
    truth: a list (an empty one holds no item array), where uvicorn makes a deque."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


class Flow(FlowControl):
    """uvicorn's flow control with its writable event a `LazyEvent` from the start (uvicorn's
    makes an `asyncio.Event`)."""

    # Read per chunk by the `send_nowait` write: a slot, read in place by the compiled one.
    __slots__ = ("write_paused",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event = LazyEvent(True)  # type: ignore[assignment]
