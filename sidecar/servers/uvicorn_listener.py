"""The uvicorn adapter: the traffic listener (HTTP/1.1) and the admin listener as servers.

Each serves a socket the sidecar bound and put to listen itself (`serve(sockets=[sock])`):
the address in the config is only what uvicorn's messages name.

`use_internals()` asks the gate in `sidecar.servers.uvicorn_internals` once, at start.
When it says yes, the traffic port runs the sidecar's own protocol (`sidecar.servers.http1`,
handed over by `Config(http=...)`: request-head deadline and size cap, request-body deadline
and trailer cap, CONNECT 405, the `sidestream.send_nowait` extension) and both servers wait
on an event instead of polling; when it says no, both run
on uvicorn's public path (its own `httptools` protocol and main loop, the body deadline kept
by `body_deadline.BodyDeadline`) and one log line says what was left out.
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

from sidecar.config import Settings
from sidecar.servers import uvicorn_internals
from sidecar.servers.body_deadline import BodyDeadline
from sidecar.servers.http1 import Http1Protocol, protocol_class
from sidecar.servers.uvicorn_internals import EventServer, QuietServer

logger = logging.getLogger("sidestream")

HEAD_SLACK_BYTES = 8192  # the request line and framing on top of --max-header-bytes


def use_internals() -> bool:
    """The gate's answer for the installed uvicorn; one warning line when it is no."""
    if uvicorn_internals.checked():
        return True
    logger.warning(
        "uvicorn %s is not a release sidestream was checked against (%s): the HTTP/1.1 "
        "listener runs on uvicorn's plain httptools protocol, without the send_nowait fast "
        "path, the request-head deadline and size cap, or the trailer cap (request "
        "trailers then reach the app as headers)",
        uvicorn.__version__,
        ", ".join(uvicorn_internals.CHECKED),
    )
    return False


def traffic_protocol(settings: Settings) -> type[Http1Protocol]:
    """The traffic listener's HTTP/1.1 protocol for these settings (behind the gate): a
    trailer block may be as large as the headers (`--max-header-bytes`)."""
    return protocol_class(
        settings.header_timeout,
        settings.max_header_bytes + HEAD_SLACK_BYTES,
        settings.body_timeout,
        settings.max_header_bytes,
    )


def traffic_server(app: Any, settings: Settings, *, internals: bool) -> QuietServer:
    """uvicorn serving `app` on the traffic port, with TLS when configured. `app` is served
    as an ASGI 3 callable without uvicorn's guess: a plain function that returns the
    request's awaitable will do (`StreamGuard.handle`, one coroutine frame less per stream)."""
    config = _config(
        app if internals else BodyDeadline(app, settings.body_timeout),
        settings,
        settings.listen,
        backlog=4096,
        interface="asgi3",
        http=traffic_protocol(settings) if internals else "httptools",
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
    )
    return EventServer(config) if internals else QuietServer(config)


def admin_server(app: Any, settings: Settings, *, internals: bool) -> QuietServer:
    """uvicorn serving the admin app on the admin port."""
    assert settings.admin_listen is not None
    config = _config(app, settings, settings.admin_listen, http="httptools")
    return EventServer(config) if internals else QuietServer(config)


def _config(app: Any, settings: Settings, listen: tuple[str, int], **extra: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=listen[0],
        port=listen[1],
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        log_level=settings.log_level,
        log_config=None,
        timeout_graceful_shutdown=1,
        **extra,
    )
