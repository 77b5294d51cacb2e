"""The store's commands sent as one pipelined request; on a Redis Cluster, the ASK and MOVED
replies in it followed.

redis-py's cluster pipeline follows a redirect by sending the command again through
`RedisCluster.execute_command`, which on ASK sends `ASKING` and then the command as two
calls to the node, each on whichever pooled connection to it is free first (redis-py 8.2
checked: `ClusterNode.acquire_connection` takes the oldest free one, `release` puts it last).
With two or more connections to that node, the command often goes on one that did not send
ASKING; the importing node answers MOVED back to the old owner, which answers ASK again, and
redis-py gives up ("TTL exhausted"): while a slot migrated, most writes to it failed. Here
an ASK is followed on a node client of its own with one connection (`ClusterNode`, public,
`max_connections=1`), so that ASKING and the command go on the same one; a MOVED (or
TRYAGAIN) through `RedisCluster.execute_command`, which follows it and updates the
client's slot map. Only the store's writer runs batches, one at a time: the node clients
are never shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode
from redis.exceptions import AskError, MovedError, TryAgainError

from middleware.resume.redis_connect import ERRORS

Command = tuple[Any, ...]  # a command's words, as `execute_command` takes them


class Batches:
    """Sends lists of commands to one store, each list as one pipelined request."""

    __slots__ = ("asked", "client", "cluster")

    def __init__(self, client: Any, cluster: bool) -> None:
        self.client = client
        self.cluster = cluster
        self.asked: dict[tuple[str, int], ClusterNode] = {}  # an ASK's node: one connection

    async def run(self, commands: Sequence[Command]) -> list[Any]:
        """The replies, in order, a command Redis refused as its exception; raises what
        redis-py raises for the request as a whole (a connection lost, a node unknown)."""
        pipe = self.client.pipeline(transaction=False)
        for words in commands:
            pipe.execute_command(*words)
        if not self.cluster:
            return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
        replies = list(await pipe.execute(raise_on_error=False, allow_redirections=False))
        for at, reply in enumerate(replies):
            if isinstance(reply, MovedError | TryAgainError) or (
                isinstance(reply, AskError) and not reply.host
            ):
                replies[at] = await self._again(commands[at])
            elif isinstance(reply, AskError):
                replies[at] = await self._asking(reply.host, reply.port, commands[at])
        return replies

    async def _again(self, words: Command) -> Any:
        try:
            return await self.client.execute_command(*words)
        except ERRORS as exc:
            return exc

    async def _asking(self, host: str, port: int, words: Command) -> Any:
        node = self.asked.get((host, port))
        if node is None:
            options = {**self.client.get_connection_kwargs(), "max_connections": 1}
            node = self.asked[host, port] = ClusterNode(host, port, **options)
        try:
            await node.execute_command("ASKING")
            return await node.execute_command(*words)
        except ERRORS as exc:
            return exc

    async def aclose(self) -> None:
        for node in self.asked.values():
            await node.disconnect()
        self.asked.clear()
