"""What the protocol sets and makes as uvicorn does, in fewer steps: a server's fields that
its connections share (`_serve`), a connection's addresses, a request parser, a request's
target (`target`) and headers (`read_headers`, with a compiled twin).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from itertools import repeat
from typing import Any, Protocol

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from uvicorn.server import ServerState

from sidecar.speedups import heads

# The last connection's server address and client host, handed to the next connection when
# its own are equal (the usual: one listening address, one client host, a proxy's or a
# sidecar's neighbour's): an open stream then holds no copies of its own (about 180 bytes).
_last: list[Any] = [None, None]


def _addresses(
    transport: asyncio.Transport,
) -> tuple[tuple[str, int | None] | None, tuple[str, int] | None]:
    """uvicorn's `get_local_addr` and `get_remote_addr`, from the transport's extra info
    (asyncio's keeps the addresses read at accept; uvloop's kept them at accept too): uvicorn's
    go through a socket object made for the question. An address that is not a (host, port,
    ...) tuple (a Unix socket's) is left to uvicorn's."""
    local, remote = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
    if isinstance(local, tuple) and isinstance(remote, tuple):
        server, host = local[:2], remote[0]
        if server == _last[0]:
            server = _last[0]
        else:
            _last[0] = server
        if host == _last[1]:
            host = _last[1]
        else:
            _last[1] = host
        return server, (host, remote[1])
    return get_local_addr(transport), get_remote_addr(transport)


_LENIENT = hasattr(httptools.HttpRequestParser, "set_dangerous_leniencies")  # httptools >= 0.6.3


def _request_parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    """A request parser for `protocol`, as uvicorn makes one."""
    parser = httptools.HttpRequestParser(protocol)
    if _LENIENT:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def _read_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    """uvicorn's `on_header`, for all of a request's headers at once, in place: names
    lower-cased, values without the trailing blanks llhttp keeps. Is one of them
    `expect: 100-continue`?"""
    names, values = zip(*headers, strict=True)
    names = tuple(map(bytes.lower, names))
    headers[:] = zip(names, map(bytes.rstrip, values, repeat(b" \t")), strict=True)
    return b"expect" in names and (b"expect", b"100-continue") in (
        (name, value.lower()) for name, value in headers
    )


# A request target that is a path alone, in the characters RFC 3986 allows in one (no query,
# no fragment): what most requests to an LLM server send.
_PATH_ALONE = re.compile(rb"/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*")


def target(url: bytes) -> tuple[bytes, bytes]:
    """The raw path and query string (b"" for none) of a request target, as uvicorn reads
    them with `httptools.parse_url`: a path alone is its own path, without the URL object
    `parse_url` makes (on the path to the first token); any other target goes to it."""
    if _PATH_ALONE.fullmatch(url):
        return url, b""
    parsed = httptools.parse_url(url)
    return parsed.path, parsed.query or b""


# The compiled twin where it was built (`sidecar/_heads.c`): on the path to each stream's
# first token, where this one's passes over a cold cache cost more than the rest of the head.
read_headers: Callable[[list[tuple[bytes, bytes]]], bool] = (
    _read_headers if heads is None else heads.read_headers
)


class Served(Protocol):
    """What `_serve` reads of the protocol it serves (`protocol.GuardedHttpToolsProtocol`)."""

    _served: ServerState | None


def _serve(
    protocol: Served,
    config: Config,
    server_state: ServerState,
    app_state: dict[str, Any],
    loop: asyncio.AbstractEventLoop | None,
) -> None:
    """uvicorn's fields that every connection of a server has alike: kept on the protocol's
    class for the first server that uses it (`protocol_class` makes a class per listener),
    set on each connection, as uvicorn sets them, for any other server."""
    on_class = type(protocol)._served is None
    owner: Any = type(protocol) if on_class else protocol
    if not config.loaded:
        config.load()
    owner.config = config
    # On the class a plain function would be bound to the connection as a method.
    owner.app = staticmethod(config.loaded_app) if on_class else config.loaded_app
    owner.loop = loop or asyncio.get_event_loop()
    owner.ws_protocol_class = config.ws_protocol_class
    owner.root_path = config.root_path
    owner.asgi_version = config.asgi_version
    owner.limit_concurrency = config.limit_concurrency
    owner.app_state = app_state
    owner.timeout_keep_alive = config.timeout_keep_alive
    owner.server_state = server_state
    owner.connections = server_state.connections
    owner.tasks = server_state.tasks
    owner._served = server_state
