"""The traffic listener's HTTP/1.1 server side: sidestream's own `asyncio.Protocol` on
httptools, handed to uvicorn through `Config(http=...)` (`protocol_class`). It relies on
uvicorn only for what its `Server` asks of a protocol class, all of it named in
`sidecar.servers.uvicorn_internals`; no class of uvicorn's is subclassed.

Modules, one concern each: `protocol` (the connection and its parser's callbacks),
`cycle` (one request's `receive`, `send` and app task), `turns` (one request
after another: pipelining, keep-alive, shutdown), `limits` (the request-head limits
and the answers written when one is crossed), `body` (the request-body deadline and the
trailer cap), `nowait` (the `sidestream.send_nowait` offer and write, emptied when a
request is done), `upgrade` (a WebSocket handed to uvicorn's protocol for it),
`connection` (a connection's addresses, a request's parser, target and headers), `events`
(flow control and the lazy event).
"""

from __future__ import annotations

from sidecar.servers.http1.cycle import RequestCycle
from sidecar.servers.http1.events import Flow, LazyEvent
from sidecar.servers.http1.limits import HeadLimits
from sidecar.servers.http1.nowait import NowaitOffer, send_nowait
from sidecar.servers.http1.protocol import Http1Protocol, protocol_class

__all__ = [
    "Flow",
    "HeadLimits",
    "Http1Protocol",
    "LazyEvent",
    "NowaitOffer",
    "RequestCycle",
    "protocol_class",
    "send_nowait",
]
