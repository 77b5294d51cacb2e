"""A throwaway `redis-server` (Debian's package) on a free 127.0.0.1 port, no persistence."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator

from tests.support.procs import free_port


class RedisServer:
    def __init__(self, *extra: str) -> None:
        """`extra`: more redis-server arguments (config directives)."""
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--loglevel", "warning",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    async def ready(self) -> None:
        for _ in range(400):
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                try:
                    writer.write(b"PING\r\n")
                    line = await reader.readline()
                finally:
                    writer.close()
                if line == b"+PONG\r\n":
                    return
            await asyncio.sleep(0.025)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextlib.asynccontextmanager
async def redis_server(*extra: str) -> AsyncIterator[RedisServer]:
    # Fail, not skip: without it the Redis store would go untested unnoticed.
    assert shutil.which("redis-server") is not None, (
        "redis-server is not installed (.ci/run installs it)"
    )
    server = RedisServer(*extra)
    try:
        await server.ready()
        yield server
    finally:
        server.kill()
