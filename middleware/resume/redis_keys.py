"""The Redis store's keys, for a stream `<id>` (each name after `PREFIX`):

- `<id>` — a Redis stream: event n is entry `<n>-1` with field `e` (empty: `store.LOST`, an
  event too large to store); the end marker is one more entry with field `end` (the
  outcome). Trimmed by `XTRIM MINID` past `max_bytes`, expired `ttl` seconds after its last
  write;
- `<id>:m` — JSON: the credential hash `c` (`ids.credential_hash`), the producing replica
  `r`, the first response's allowed origin `o`, the generating span `t`; same expiry;
- `<id>:r` — present while a reader on some replica is attached (refreshed by it), so the
  producing replica's grace period waits for it;
- `replica:<replica>` — the producing replica's liveness, refreshed every second with a
  3 s expiry: a reader whose producer vanished ends with a terminal `upstream_error`;
- channel `stop` — DELETE on any replica publishes the id; its producer stops it.
"""

PREFIX = "sidestream:resume:"
REFRESH_SECONDS = 1.0  # how often a live key (liveness, reader, a stream's expiry) is refreshed
