"""The client side of one request: its body, and how the stream hears the client leave.

uvicorn drops `send()` silently once the client is gone, so a stream only learns of a
disconnect by reading `receive()`. Once the request body is complete, one watcher task per
request reads it and calls `on_disconnect` the moment `http.disconnect` arrives; the app's
own later `receive()` calls wait for that same moment instead of reading concurrently.

A server that says so itself needs no watcher: the sidecar's HTTP/1.1 server calls `left()`
from its connection-lost callback (the `SEND_NOWAIT` extension's `on_disconnect`, see
`middleware.types`), in the very loop turn the close is seen, and a stream held open for
minutes keeps no task, coroutine or future for it. The watcher still reads a body the app
has not read (`read_for_app`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from middleware.types import Message, Receive

DISCONNECT: Message = {"type": "http.disconnect"}
STASH_MESSAGES = 16  # request-body messages held for an app that streams before reading its body


class Receiver:
    """The app's `receive` for one request, and its disconnect watcher."""

    __slots__ = (
        "body_done",
        "client_gone",
        "closed",
        "gone",
        "on_disconnect",
        "source",
        "stash",
        "told",
        "watcher",
    )

    def __init__(self, source: Receive, on_disconnect: Callable[[], None]) -> None:
        self.source = source  # the server's receive
        self.on_disconnect: Callable[[], None] | None = on_disconnect  # None once stopped
        self.told = False  # the server calls `left()` itself: no watcher needed for that
        self.body_done = False
        self.client_gone = False
        self.closed = False  # the response is complete: nothing left to watch for
        self.gone: asyncio.Event | None = None
        self.stash: asyncio.Queue[Message] | None = None
        self.watcher: asyncio.Task[None] | None = None

    def tap(self, wrap: Callable[[Receive], Receive]) -> None:
        """Read the server's messages through `wrap(receive)` (telemetry keeps the body)."""
        self.source = wrap(self.source)

    async def receive(self) -> Message:
        stash = self.stash
        if stash is not None and not (self.body_done and stash.empty()):
            if self.client_gone and stash.empty():
                return DISCONNECT
            return await stash.get()
        if self.body_done:  # then only the client's leaving is left to hear
            if not self.client_gone:
                if self.gone is None:
                    self.gone = asyncio.Event()
                await self.gone.wait()
            return DISCONNECT
        message = await self.source()
        if message["type"] == "http.request":
            if not message.get("more_body", False):
                self.body_done = True
                if not self.told:
                    self.watch()
        elif message["type"] == "http.disconnect":
            self.body_done = True
            self.left()
        return message

    def read_for_app(self) -> None:
        """The app streams before it has read its body (a GET handler that never calls
        receive): the watcher reads the body for it, into a bounded stash."""
        if not self.body_done and self.watcher is None:
            self.stash = asyncio.Queue(STASH_MESSAGES)
            self.watch()

    def watch(self) -> None:
        if self.watcher is None and not self.closed and not self.client_gone:
            self.watcher = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        """The request has run: nothing more to hear for it."""
        self.on_disconnect = None
        if self.watcher is not None:
            self.watcher.cancel()

    async def _watch(self) -> None:
        """The one reader of the server's `receive` once the request body is in."""
        receive = self.source
        while True:
            message = await receive()
            stash = self.stash
            if message["type"] == "http.disconnect":
                self.left()
                if stash is not None:
                    await stash.put(message)
                return
            if stash is not None:
                await stash.put(message)
                if not message.get("more_body", False):
                    self.body_done = True
                    if self.told:
                        return  # the body is in, and the server tells of a disconnect

    def left(self) -> None:
        """The client is gone (heard by the watcher, the app's own read, or the server)."""
        if self.client_gone:
            return
        self.client_gone = True
        if self.gone is not None:
            self.gone.set()
        if self.on_disconnect is not None:
            self.on_disconnect()
