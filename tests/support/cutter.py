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
    """Serve the relay; yield (its port, the request heads whose connection it cut)."""
    cut: list[bytes] = []

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
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
        with contextlib.suppress(ConnectionError, OSError):
            while data := await server_r.read(65536):
                client_w.write(data)
                await client_w.drain()
                sent += len(data)
                if cut_at is not None and sent >= cut_at:
                    cut.append(head)
                    break
        up.cancel()
        for writer in (client_w, server_w):
            writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, cut
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)
