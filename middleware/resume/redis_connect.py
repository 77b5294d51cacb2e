"""Connecting to the Redis store, and the store's URL as a log line may show it.

`redis://[USER:PASSWORD@]HOST:PORT[/DB]`, `rediss://…` (TLS) and `unix://PATH` are read by
redis-py's own URL handling, never by hand. Two things may come apart from the URL: the
password (read from a file, so that it stays out of a pod spec) and, for `rediss://`, CA
certificates trusted besides the system's. redis-py names a failed connection by host and
port only; the URL, which may hold the password, goes to a log line only through `shown`.
"""

from __future__ import annotations

import urllib.parse
from typing import Any


def connect(url: str, *, password: str | None = None, ca: str | None = None, **options: Any) -> Any:
    """A `redis.asyncio.Redis` client for `url` (no connection is made yet); ValueError, naming
    the URL only as `shown`, for a URL redis-py refuses or options that do not fit it."""
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


def shown(url: str) -> str:
    """`url` with its password, in the user part or in the query, as `***`."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(a URL that cannot be read)"
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    netloc = f"{user}{colon and ':***'}{at}{host}"
    query = []
    for pair in parts.query.split("&"):
        name = pair.partition("=")[0]
        query.append(f"{name}=***" if "password" in urllib.parse.unquote(name).lower() else pair)
    tail = f"?{'&'.join(query)}" if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{tail}"  # every store URL has `//`
