"""Connecting to the Redis store, and the store's URL as a log line may show it.

`redis://[USER:PASSWORD@]HOST:PORT[/DB]`, `rediss://…` (TLS) and `unix://PATH` are read by
redis-py's own URL handling, never by hand. Two things may come apart from the URL: the
password (read from a file, so that it stays out of a pod spec) and, for `rediss://`, CA
certificates trusted besides the system's. redis-py names a failed connection by host and
port only; the URL, which may hold the password, goes to a log line only through `shown`.

`redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB]` names the sentinels
of a primary; redis-py has no URL form for it, so it is read here (`sentinel_url`) and handed
to redis-py's `Sentinel`, whose `master_for(SERVICE)` finds the primary and follows a
failover. The user and password are the primary's (and its replicas'); the sentinels are
asked without them, redis-py's default (`sentinel_kwargs` carries only socket options).

`redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` names some nodes of a Redis Cluster
(`cluster_url`); redis-py's `RedisCluster` learns the rest, and each slot's node, from them,
and follows MOVED by itself (ASK: `redis_batch`). A cluster has one database: no path is read.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SENTINEL = "redis+sentinel://"
SENTINEL_PORT = 26379
CLUSTER = "redis+cluster://"
REDIS_PORT = 6379


def _errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisClusterException, RedisError

    # `RedisClusterException` (no node reachable, a slot no node serves) is no `RedisError`.
    return RedisError, RedisClusterException, OSError


ERRORS = _errors()  # what a store command may raise: the store failed, the stream goes on


@dataclass(frozen=True)
class SentinelURL:
    """What a `redis+sentinel://` URL names: no connection is made."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None


@dataclass(frozen=True)
class ClusterURL:
    """What a `redis+cluster://` URL names: no connection is made."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None


def connect(url: str, *, password: str | None = None, ca: str | None = None, **options: Any) -> Any:
    """A `redis.asyncio.Redis` client for `url` (no connection is made yet); ValueError, naming
    the URL only as `shown`, for a URL redis-py refuses or options that do not fit it."""
    if url.startswith(SENTINEL):
        return _sentinel_client(url, password, ca, options)
    if url.startswith(CLUSTER):
        return _cluster_client(url, password, ca, options)
    import redis.asyncio as aioredis
    from redis.asyncio.connection import SSLConnection, parse_url

    try:
        parsed = parse_url(url)
    except ValueError as exc:
        raise ValueError(f"{shown(url)}: {exc}") from None
    if password is not None:
        if "password" in parsed:
            raise ValueError(f"{shown(url)}: the password is given twice (in the URL and apart)")
        options["password"] = password
    if parsed.get("connection_class") is SSLConnection:
        options["ssl_check_hostname"] = True  # redis-py 5 did not check by default
        if ca is not None:
            options["ssl_ca_certs"] = ca
    elif ca is not None:
        raise ValueError(f"{shown(url)}: CA certificates are for a rediss:// (TLS) store")
    client: Any = aioredis.from_url(url, **options)
    try:  # redis-py takes any query argument, and refuses an unknown one at the first command
        client.connection_pool.make_connection()
    except TypeError as exc:
        raise ValueError(f"{shown(url)}: {exc}") from None
    return client


def _sentinel_client(url: str, password: str | None, ca: str | None, options: Any) -> Any:
    """`master_for(SERVICE)` of a redis-py `Sentinel` on the URL's sentinels."""
    from redis.asyncio.sentinel import Sentinel

    parsed = sentinel_url(url)
    if ca is not None:
        raise ValueError(f"{shown(url)}: CA certificates are for a rediss:// (TLS) store")
    if password is not None:
        if parsed.password is not None:
            raise ValueError(f"{shown(url)}: the password is given twice (in the URL and apart)")
        options["password"] = password
    elif parsed.password is not None:
        options["password"] = parsed.password
    if parsed.username is not None:
        options["username"] = parsed.username
    sockets = {name: value for name, value in options.items() if name.startswith("socket_")}
    sentinel = Sentinel(parsed.sentinels, sentinel_kwargs=sockets)
    return sentinel.master_for(parsed.service, db=parsed.db, **options)


def _cluster_client(url: str, password: str | None, ca: str | None, options: Any) -> Any:
    """A redis-py `RedisCluster` started from the URL's nodes."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    parsed = cluster_url(url)
    if ca is not None:
        raise ValueError(f"{shown(url)}: CA certificates are for a rediss:// (TLS) store")
    if password is not None and parsed.password is not None:
        raise ValueError(f"{shown(url)}: the password is given twice (in the URL and apart)")
    nodes = [ClusterNode(host, port) for host, port in parsed.nodes]
    secret = password if password is not None else parsed.password
    return RedisCluster(startup_nodes=nodes, username=parsed.username, password=secret, **options)


def cluster_url(url: str) -> ClusterURL:
    """The parts of a `redis+cluster://` URL; ValueError, naming it only as `shown`."""

    bad, username, password, hosts, path = _split(
        url, CLUSTER, "[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]"
    )
    if path:
        raise bad("a cluster has one database: no path is read")
    nodes = tuple(_address(part, n, bad, "node", REDIS_PORT) for n, part in enumerate(hosts.split(","), 1))  # fmt: skip
    return ClusterURL(nodes, username, password)


def _split(
    url: str, scheme: str, form: str
) -> tuple[Callable[[str], ValueError], str | None, str | None, str, str]:
    """A `scheme`USER:PASSWORD@HOSTS/PATH URL (no query, no fragment) in parts: the error
    maker for it (naming the URL only as `shown`, then the expected `form`), the user and
    password (percent-decoded, None if absent), HOSTS and PATH."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{shown(url)}: {why} (expected {scheme}{form})")

    rest = url[len(scheme) :]
    if "?" in rest or "#" in rest:
        raise bad("a query or fragment is not read")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if colon else None
    return bad, username, password, hosts, path


def sentinel_url(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL; ValueError, naming it only as `shown`."""

    form = "[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB]"
    bad, username, password, hosts, path = _split(url, SENTINEL, form)
    sentinels = tuple(
        _address(part, n, bad, "sentinel", SENTINEL_PORT)
        for n, part in enumerate(hosts.split(","), 1)
    )
    service, _, db = path.partition("/")
    if not service:
        raise bad("no SERVICE (the primary's name in the sentinels' configuration)")
    if db and not (db.isascii() and db.isdigit() and len(db) <= 5):
        raise bad("the database is not a number")
    return SentinelURL(sentinels, urllib.parse.unquote(service), int(db or 0), username, password)


def _address(part: str, number: int, bad: Any, kind: str, default: int) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or HOST (port `default`). An error names the `kind` address by
    its place: a password with an unescaped `/` would be in the text."""
    host, port = part, ""
    if part.startswith("["):
        host, bracket, port = part[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise bad(f"{kind} address {number} cannot be read")
        port = port[1:]
    elif ":" in part:
        host, _, port = part.rpartition(":")
    if not host or any(c in host for c in " /@[]"):
        raise bad(f"{kind} address {number} has no host")
    if not port:
        return host, default
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise bad(f"{kind} address {number} has no valid port")
    return host, int(port)


def shown(url: str) -> str:
    """`url` with its password, in the user part or in the query, as `***`. The user part
    ends at the last `@`, so that a password with an unescaped `/`, `?` or `@` stays hidden."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, tail = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    path, mark, query = tail.partition("?")
    pairs = []
    for pair in query.split("&"):
        name = pair.partition("=")[0]
        pairs.append(f"{name}=***" if "password" in urllib.parse.unquote(name).lower() else pair)
    tail = f"{path}{mark}{'&'.join(pairs)}"
    return f"{scheme}{sep}{user}{colon and ':***'}{at}{tail}"
