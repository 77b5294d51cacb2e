"""A throwaway `redis-server` (Debian's package) on a free 127.0.0.1 port, no persistence;
with TLS only when asked (`tls=`), and the flags a sidecar needs for a Redis store."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import secrets
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tests.support.procs import free_port
from tests.support.tools import tool


@functools.cache
def secret_file() -> str:
    """A file holding a resume secret, one per test process: the sidecars a test starts on
    one Redis share it, as replicas must (`--resume-secret-file`)."""
    handle, path = tempfile.mkstemp(prefix="sidestream-resume-secret-")
    os.write(handle, secrets.token_urlsafe(32).encode())
    os.close(handle)
    atexit.register(os.unlink, path)
    return path


def store_flags(url: str) -> tuple[str, ...]:
    """The sidecar flags for a Redis resume store at `url`, with the shared secret it needs."""
    return ("--resume-store", url, "--resume-secret-file", secret_file())


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the server's certificate and key, and the CA that issued the certificate."""

    cert: str
    key: str
    ca: str


class RedisServer:
    def __init__(self, *extra: str, tls: TLSFiles | None = None) -> None:
        """`extra`: more redis-server arguments (config directives); `tls`: serve TLS only,
        on the port (`rediss://`), clients not asked for a certificate."""
        self.port = free_port()
        self.tls = tls
        scheme = "redis" if tls is None else "rediss"
        self.url = f"{scheme}://127.0.0.1:{self.port}/0"
        ports = ["--port", str(self.port)]
        if tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", tls.cert]
            ports += ["--tls-key-file", tls.key, "--tls-ca-cert-file", tls.ca]
            ports += ["--tls-auth-clients", "no"]
        self.process = subprocess.Popen(
            [
                tool("redis-server"),
                *ports,
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--loglevel", "warning",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    async def ready(self) -> None:
        context = None if self.tls is None else ssl.create_default_context(cafile=self.tls.ca)
        for _ in range(400):
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=context)
                try:
                    writer.write(b"PING\r\n")
                    line = await reader.readline()
                finally:
                    writer.close()
                if line == b"+PONG\r\n" or line.startswith(b"-NOAUTH"):  # up (a password)
                    return
            await asyncio.sleep(0.025)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextlib.asynccontextmanager
async def redis_server(*extra: str, tls: TLSFiles | None = None) -> AsyncIterator[RedisServer]:
    server = RedisServer(*extra, tls=tls)
    try:
        await server.ready()
        yield server
    finally:
        server.kill()
