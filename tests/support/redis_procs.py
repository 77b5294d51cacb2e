"""Redis processes for failover tests: a redis-server on a given port (so that one can be
restarted where the last one was), and a Sentinel group on free 127.0.0.1 ports: a primary,
a replica and three sentinels (`redis-server <conf> --sentinel`), with short timeouts so that
a failover takes a few seconds. Every wait is bounded; `kill` ends every process."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from tests.support.procs import free_port
from tests.support.tools import tool

SERVICE = "sidestream"
DOWN_AFTER_MS = 1000  # a primary silent this long is down (the default is 30 s)
FAILOVER_TIMEOUT_MS = 3000


def start_redis(port: int, *extra: str) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:`port`, no persistence: a restart loses every key."""
    return subprocess.Popen(
        [
            tool("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loglevel", "warning", *extra,
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


async def until(check: Any, timeout: float, what: str) -> Any:
    """Call `check()` (async) until it returns something true, for `timeout` seconds at most;
    connection errors count as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(aioredis.RedisError, OSError):
            if result := await check():
                return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


async def answers(port: int, timeout: float = 10.0) -> None:
    """Wait until the server (or sentinel) on `port` answers PING."""
    client = aioredis.Redis(port=port, socket_connect_timeout=0.5)
    try:
        await until(client.ping, timeout, f"redis on port {port}")
    finally:
        await client.aclose()


class SentinelGroup:
    """A primary, a replica and three sentinels monitoring the primary as `SERVICE`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sidestream-sentinel-"))
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes = [start_redis(self.primary_port)]
        self.primary = self.processes[0]
        self.processes.append(
            start_redis(self.replica_port, "--replicaof", "127.0.0.1", str(self.primary_port))
        )
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"  # a sentinel rewrites its own file
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [tool("redis-server"), str(conf), "--sentinel", "--loglevel", "warning"],
                    stdout=subprocess.DEVNULL,
                )
            )
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        self.url = f"redis+sentinel://{hosts}/{SERVICE}/0"

    async def ready(self) -> None:
        """Every process answers, the replica is in sync, and each sentinel knows the replica
        and the two other sentinels (without which no failover can be agreed)."""
        for port in (self.primary_port, self.replica_port, *self.sentinel_ports):
            await answers(port)
        primary = aioredis.Redis(port=self.primary_port)
        try:

            async def synced() -> bool:
                info = await primary.info("replication")
                return bool(info.get("slave0", {}).get("state") == "online")

            await until(synced, 20, "the replica's first sync")
        finally:
            await primary.aclose()
        for port in self.sentinel_ports:
            sentinel = aioredis.Redis(port=port)
            try:

                async def knows(sentinel: Any = sentinel) -> bool:
                    others = await sentinel.execute_command("SENTINEL", "SENTINELS", SERVICE)
                    replicas = await sentinel.execute_command("SENTINEL", "REPLICAS", SERVICE)
                    return len(others) == 2 and len(replicas) == 1

                await until(knows, 30, f"sentinel {port} discovering the others")
            finally:
                await sentinel.aclose()

    async def failed_over(self, timeout: float = 30.0) -> None:
        """Wait until every sentinel names the replica as the primary (a client asks them in
        turn, and one that has not heard of the failover yet names the dead primary)."""
        for port in self.sentinel_ports:
            sentinel = aioredis.Redis(port=port)
            try:

                async def promoted(sentinel: Any = sentinel) -> bool:
                    _, primary = await sentinel.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                    )
                    return int(primary) == self.replica_port

                await until(promoted, timeout, f"the failover, as sentinel {port} sees it")
            finally:
                await sentinel.aclose()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def sentinel_group() -> AsyncIterator[SentinelGroup]:
    group = SentinelGroup()
    try:
        await group.ready()
        yield group
    finally:
        group.kill()
