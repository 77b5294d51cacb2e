"""Every use of uvicorn's private internals: the traffic listener's HTTP/1.1 protocol and the
servers' main loop.

Checked against uvicorn 0.55.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
version's major.minor is one checked and every hook overridden here still exists. When it
says no, `sidecar.servers.uvicorn_listener` serves with the public path instead — uvicorn's
own `http="httptools"` protocol and main loop — and logs one line at start. A runtime gate,
not a bound in pyproject, because that public path serves every stream correctly: what it
loses is the `sidestream.send_nowait` fast path, the request-head limits (`limits`) and the
trailer cap (`body`: uvicorn's own protocol appends request trailers to the headers; the body
deadline is kept there by `sidecar.servers.body_deadline`), not the streams' correctness, and
an upper bound would block users from uvicorn's own fixes.

Private names used (only when the gate says yes, except `capture_signals`):
- `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`: subclassed. Its `__init__` and
  the callbacks run for every connection and request (`connection_made`, `connection_lost`,
  `data_received`, `on_message_begin`, `on_header`, `on_headers_complete`,
  `on_message_complete`, `on_response_complete`; `on_body` in `body`) are written out with
  the sidecar's additions in line, setting uvicorn's fields for the methods of its that
  still run (`on_url`, `_start_asgi_task`, `send_400_response`, the upgrade ones,
  `shutdown`, the keep-alive timeout); `_unsupported_upgrade_warning` overridden; `parser`
  dropped between requests and made again as uvicorn makes it; `on_chunk_header` added.
- `RequestResponseCycle`: subclassed (`RequestCycle`): `__init__`, `run_asgi`, `send` and
  `receive` written out (the head by `sidecar.servers.response_head`, uvicorn's rules, and
  held for the first body write), `send_500_response` uvicorn's. Its `flow.write_paused`,
  `disconnected`,
  `response_complete`, `chunked_encoding` and `transport` are read per chunk by the
  `send_nowait` extension (`nowait`, and its compiled twin, `sidecar/_core.c`'s
  `ChunkWriter`); `disconnected` set and `response_complete` read when the connection is
  lost (the extension's `on_disconnect`).
- the protocol's `pipeline`, `flow` (`FlowControl`, subclassed) and each cycle's
  `message_event`, made as lighter objects with the same methods (`events`).
- `uvicorn.protocols.utils`' address functions, for a transport that did not keep the
  addresses it accepted on (the protocol asks the transport: uvicorn asks the socket, each
  time through a socket object made for the question, two more system calls each).
- `uvicorn.Server`: `capture_signals` (replaced on both paths: uvicorn has no public switch
  for its signal handlers, and the sidecar decides what a signal means — drain first),
  `main_loop` and `on_tick` (replaced only behind the gate).

Modules, one concern each: `protocol` (the traffic protocol, `protocol_class`), `limits`
(its request-head limits), `body` (its request-body deadline and trailer cap), `nowait`
(the `sidestream.send_nowait` offer and write, emptied when a request is done), `cycle`
(the per-request cycle), `connection` (what the protocol sets per server and makes per
connection and per request), `events` (the lighter pipeline, flow and events), `server`
(the main loop).
"""

from __future__ import annotations

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from sidecar.servers.uvicorn_internals.cycle import RequestCycle
from sidecar.servers.uvicorn_internals.events import Flow, LazyEvent, Pipeline
from sidecar.servers.uvicorn_internals.limits import HeadLimits
from sidecar.servers.uvicorn_internals.nowait import NowaitOffer, send_nowait
from sidecar.servers.uvicorn_internals.protocol import GuardedHttpToolsProtocol, protocol_class
from sidecar.servers.uvicorn_internals.server import EventServer, QuietServer

__all__ = [
    "CHECKED",
    "EventServer",
    "Flow",
    "GuardedHttpToolsProtocol",
    "HeadLimits",
    "LazyEvent",
    "NowaitOffer",
    "Pipeline",
    "QuietServer",
    "RequestCycle",
    "checked",
    "protocol_class",
    "send_nowait",
]


CHECKED = ("0.55",)  # uvicorn major.minor releases these internals were read in

_PROTOCOL_HOOKS = (  # written out here, or called by name
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "_unsupported_upgrade_warning",
    "_should_upgrade",
    "handle_websocket_upgrade",
    "send_400_response",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
    "timeout_keep_alive_handler",
)
_CYCLE_HOOKS = ("send", "receive", "run_asgi")
_SERVER_HOOKS = ("capture_signals", "main_loop", "on_tick")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed uvicorn) one these internals were checked
    against, with every hook this package overrides still there?"""
    version = uvicorn.__version__ if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    hooks = [getattr(HttpToolsProtocol, name, None) for name in _PROTOCOL_HOOKS]
    hooks += [getattr(RequestResponseCycle, name, None) for name in _CYCLE_HOOKS]
    hooks += [getattr(uvicorn.Server, name, None) for name in _SERVER_HOOKS]
    return all(callable(hook) for hook in hooks)
