"""Redis processes for failover tests: a redis-server on a given port (so that one can be
restarted where the last one was), and a Sentinel group on free 127.0.0.1 ports: a primary,
a replica and three sentinels (`redis-server <conf> --sentinel`), with short timeouts so that
a failover takes a few seconds; and a three-node Redis Cluster (`ClusterGroup`). Every wait
is bounded; `kill` ends every process."""

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
NODE_TIMEOUT_MS = 2000  # a cluster node silent this long is failing (the default is 15 s)


def start_redis(port: int, *extra: str) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:`port`, no persistence: a restart loses every key. Its
    directory is a new temporary one: a replica writes the primary's snapshot there."""
    workdir = tempfile.mkdtemp(prefix="sidestream-redis-")
    return subprocess.Popen(
        [
            tool("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loglevel", "warning", "--dir", workdir, *extra,
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


class ClusterGroup:
    """Three cluster nodes on free 127.0.0.1 ports, each a primary with a third of the
    slots, no replicas (`redis-cli --cluster create`). A node restarted by `restart` comes
    back on its port with its node id and slots (its `nodes.conf`) and no keys."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sidestream-cluster-"))
        self.ports = [free_port() for _ in range(3)]
        self.processes = {port: self._node(port) for port in self.ports}
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _node(self, port: int) -> subprocess.Popen[bytes]:
        conf = str(self.dir / f"nodes-{port}.conf")  # the node writes its own view there
        return start_redis(port, "--cluster-enabled", "yes", "--cluster-config-file", conf,
                           "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--dir", str(self.dir))  # fmt: skip

    async def ready(self) -> None:
        """Every node answers, the slots are assigned, and every node says `cluster_state:ok`."""
        for port in self.ports:
            await answers(port)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        create = [tool("redis-cli"), "--cluster", "create", *nodes, "--cluster-replicas", "0"]
        process = await asyncio.create_subprocess_exec(
            *create, "--cluster-yes", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, output.decode(errors="replace")
        await self.settled()

    async def settled(self, timeout: float = 30.0) -> None:
        """Wait until every node says `cluster_state:ok`, every slot served."""
        for port in self.ports:
            client = aioredis.Redis(port=port, socket_connect_timeout=0.5)
            try:

                async def ok(client: Any = client) -> bool:
                    info = await client.execute_command("CLUSTER", "INFO")
                    return b"cluster_state:ok" in info and b"cluster_slots_ok:16384" in info

                await until(ok, timeout, f"cluster node {port} in a settled cluster")
            finally:
                await client.aclose()

    async def owner(self, key: str) -> int:
        """The port of the node that holds `key`'s slot (as the first node sees it)."""
        client = aioredis.Redis(port=self.ports[0])
        try:
            slot = await client.execute_command("CLUSTER", "KEYSLOT", key)
            for start, end, (_, port, *_), *_ in await client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(port)
        finally:
            await client.aclose()
        raise LookupError(f"no node holds the slot of {key!r}")

    async def move_slot(self, key: str, to: int, between: Any = None) -> None:
        """Move the slot of `key` to the node on port `to`, keys and all, as `redis-cli
        --cluster reshard` does (IMPORTING, MIGRATING, MIGRATE, SETSLOT NODE); `between`, if
        given, is awaited while the keys are moved and the slot still MIGRATING: a command on
        the old node for a key that has gone is answered ASK."""
        source = await self.owner(key)
        old, new = aioredis.Redis(port=source), aioredis.Redis(port=to)
        try:
            slot = await old.execute_command("CLUSTER", "KEYSLOT", key)
            old_id = (await old.execute_command("CLUSTER", "MYID")).decode()
            new_id = (await new.execute_command("CLUSTER", "MYID")).decode()
            await new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", old_id)
            await old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", new_id)
            while keys := await old.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                await old.execute_command("MIGRATE", "127.0.0.1", to, "", 0, 5000, "KEYS", *keys)
            if between is not None:
                await between()
            for port in (to, source, *(p for p in self.ports if p not in (to, source))):
                node = aioredis.Redis(port=port)
                try:
                    await node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", new_id)
                finally:
                    await node.aclose()
        finally:
            await old.aclose()
            await new.aclose()

    def stop(self, port: int) -> None:
        process = self.processes[port]
        process.kill()
        process.wait()

    def restart(self, port: int) -> None:
        self.processes[port] = self._node(port)

    def kill(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def cluster_group() -> AsyncIterator[ClusterGroup]:
    group = ClusterGroup()
    try:
        await group.ready()
        yield group
    finally:
        group.kill()
