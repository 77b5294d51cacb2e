"""What the protocol reads of a connection and a request, as uvicorn's own protocols read
it, in fewer steps: a connection's addresses, a request parser, a request's target
(`target`) and headers (`read_headers`, from `sidecar.head_rules` or its compiled twin), and whether it asks for a
WebSocket (`upgrade`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import httptools

from sidecar import head_rules
from sidecar.speedups import heads

# The last connection's server address and client host, handed to the next connection when
# its own are equal (the usual: one listening address, one client host, a proxy's or a
# sidecar's neighbour's): an open stream then holds no copies of its own (about 180 bytes).
_last: list[Any] = [None, None]


def addresses(
    transport: asyncio.Transport,
) -> tuple[tuple[str, int | None] | None, tuple[str, int] | None]:
    """The server's and the client's address, from the transport's extra info (asyncio's
    keeps the addresses read at accept; uvloop's kept them at accept too): uvicorn's own
    protocols ask through a socket object made for the question. An address that is not a
    (host, port, ...) tuple (a Unix socket's) is read as uvicorn reads it."""
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
    return _socket_addresses(transport)


def _socket_addresses(
    transport: asyncio.Transport,
) -> tuple[tuple[str, int | None] | None, tuple[str, int] | None]:
    """The addresses as uvicorn reads them where the transport kept no (host, port) pair: a
    Unix socket's path is the server's address (no port), and its client has none."""
    sock = transport.get_extra_info("socket")
    local = sock.getsockname() if sock is not None else transport.get_extra_info("sockname")
    try:
        remote = sock.getpeername() if sock is not None else transport.get_extra_info("peername")
    except OSError:  # uvloop on a Unix socket, at times
        remote = None
    server: tuple[str, int | None] | None = None
    if isinstance(local, (tuple, list)) and len(local) >= 2:
        server = (str(local[0]), int(local[1]))
    elif isinstance(local, str):
        server = (local, None)
    client = (str(remote[0]), int(remote[1])) if isinstance(remote, (tuple, list)) else None
    return server, client


_LENIENT = hasattr(httptools.HttpRequestParser, "set_dangerous_leniencies")  # httptools >= 0.6.3


def request_parser(protocol: object) -> httptools.HttpRequestParser:
    """A request parser calling `protocol`'s callbacks, as uvicorn makes one (lenient to
    bytes after a request that closes: a pipelined request's first response still goes)."""
    parser = httptools.HttpRequestParser(protocol)
    if _LENIENT:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


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


def locate(scope: dict[str, Any], url: bytes, root_path: str) -> None:
    """A request's `path`, `raw_path` and `query_string` in its scope, from its target, under
    the server's root path, as uvicorn sets them."""
    raw_path, query = target(url)
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    if root_path:
        path = root_path + path
        raw_path = root_path.encode("ascii") + raw_path
    scope["path"] = path
    scope["raw_path"] = raw_path
    scope["query_string"] = query


# What uvicorn's protocol does per header, for all of a request's headers at once, in place
# (names lower-cased, values without the trailing blanks llhttp keeps); True for `expect:
# 100-continue`. The compiled twin (`sidecar/_heads.c`) where it was built: on the path to each
# stream's first token.
read_headers: Callable[[list[tuple[bytes, bytes]]], bool] = (
    head_rules.read_headers if heads is None else heads.read_headers
)


def upgrade(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The protocol a request asks to upgrade to (its `upgrade` header, lower-cased), if its
    `connection` header names `upgrade`; read as uvicorn reads it, from headers already read
    (`read_headers`)."""
    connection: list[bytes] = []
    wanted = None
    for name, value in headers:
        if name == b"connection":
            connection = [token.lower().strip() for token in value.split(b",")]
        elif name == b"upgrade":
            wanted = value.lower()
    return wanted if b"upgrade" in connection else None
