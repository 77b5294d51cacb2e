"""A TCP relay on 127.0.0.1 that cuts a stream mid-way: "the server drops the connection".

Every connection is relayed both ways as is. Once a request on it is `GET /v1/stream`
without a `Last-Event-ID` header, the connection is closed (both sides) after `cut_after`
more response bytes; resumed requests (with the header) are never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def cutter(target: int, cut_after: int) -> AsyncIterator[tuple[int, list[bytes]]]:
    """Serve the relay; yield (its port, the request heads whose connection it cut).

    Every relay closes both its connections however it ends; those still running on exit
    (a kept-alive connection the upstream has not closed) are cancelled and awaited."""
    cut: list[bytes] = []
    # asyncio.start_server keeps no strong reference to a connection's task: once the client
    # closed its side, a relay waiting on the upstream is garbage, and would be collected
    # while pending with both its writers open. These references keep each until it ends.
    relays: set[asyncio.Task[None]] = set()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        relays.add(task)
        task.add_done_callback(relays.discard)
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except BaseException:
            client_w.close()
            raise
        sent = 0
        cut_at: int | None = None
        head = b""

        async def upward() -> None:
            nonlocal cut_at, head
            with contextlib.suppress(ConnectionError, OSError):
                while data := await client_r.read(65536):
                    lowered = data.lower()
                    if lowered.startswith(b"get /v1/stream") and b"last-event-id:" not in lowered:
                        cut_at, head = sent + cut_after, data
                    server_w.write(data)
                    await server_w.drain()

        up = asyncio.create_task(upward())
        try:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await server_r.read(65536):
                    client_w.write(data)
                    await client_w.drain()
                    sent += len(data)
                    if cut_at is not None and sent >= cut_at:
                        cut.append(head)
                        break
        finally:
            up.cancel()
            for writer in (client_w, server_w):
                writer.close()
            await asyncio.wait([up])
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, cut
    finally:
        server.close()
        for task in list(relays):
            task.cancel()
        if relays:
            await asyncio.wait(list(relays), timeout=2)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)
