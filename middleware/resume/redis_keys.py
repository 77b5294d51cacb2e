"""The Redis store's keys, for a stream `<id>` (each name after `PREFIX`; on a Redis Cluster
the stream's own keys are `{<id>}`, `{<id>}:m`, `{<id>}:r`: `Keys`):

- `<id>` — a Redis stream: event n is entry `<n>-1` with field `e` (empty: `store.LOST`, an
  event too large to store); the end marker is one more entry with field `end` (the
  outcome). Trimmed by `XTRIM MINID` past `max_bytes`, expired `ttl` seconds after its last
  write;
- `<id>:m` — JSON: the credential hash `c` (`ids.credential_hash`), the producing replica
  `r`, the first response's allowed origin `o`, the generating span `t`; same expiry;
- `<id>:r` — present while a reader on some replica is attached (refreshed by it), so the
  producing replica's grace period waits for it, and writes the stream's events in the turn
  they come rather than every `FLUSH_SECONDS`;
- `replica:<replica>` — the producing replica's liveness, refreshed every second with a
  3 s expiry: a reader whose producer vanished ends with a terminal `upstream_error`;
- channel `stop` — DELETE on any replica publishes the id; its producer stops it. On a
  cluster too: a PUBLISH reaches the subscribers of every node (the cluster bus carries it),
  and a stop is one message per DELETE, so the broadcast costs nothing that matters, while a
  sharded channel would follow its slot through a reshard (SSUBSCRIBE again elsewhere).
"""

PREFIX = "sidestream:resume:"
REPLICA = PREFIX + "replica:"
STOP = PREFIX + "stop"
REFRESH_SECONDS = 1.0  # how often a live key (liveness, reader, a stream's expiry) is refreshed


class Keys:
    """A stream's key: `PREFIX<id>` on one server, `PREFIX{<id>}` on a cluster, where the
    braces make the id the hash tag: the stream, its meta and its reader key share a slot
    (a script or pipeline on them stays on one node), and different streams spread over the
    slots. One server keeps the plain names, which stores written before it still use."""

    __slots__ = ("left", "right")

    def __init__(self, cluster: bool) -> None:
        self.left, self.right = ("{", "}") if cluster else ("", "")

    def stream(self, stream_id: str) -> str:
        return f"{PREFIX}{self.left}{stream_id}{self.right}"

    def stream_id(self, key: str) -> str:
        """`stream`'s inverse."""
        return key[len(PREFIX) + len(self.left) : len(key) - len(self.right)]
