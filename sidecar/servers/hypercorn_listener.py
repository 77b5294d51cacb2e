"""The hypercorn adapter: the traffic listener with `--http2`.

HTTP/1.1 and HTTP/2 on the same port — h2c with prior knowledge in cleartext, ALPN
`h2`/`http/1.1` with TLS. hypercorn's asyncio `serve()` runs behind uvicorn.Server's three
flags, so the sidecar drives both servers alike.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from sidecar.config import Settings
from sidecar.servers.body_deadline import BodyDeadline
from sidecar.servers.hypercorn_internals import (
    bound_h2_stream_buffers,
    close_in_time,
    guard_h2_floods,
    h2c_idle_timer,
)
from sidecar.servers.listener import ExitEvent

logger = logging.getLogger("sidestream")


class HypercornListener(ExitEvent):
    """hypercorn's asyncio `serve()` behind uvicorn.Server's three flags.

    It serves the socket given to `serve()` (bound and listening: the sidecar binds every
    listener before any serves), or one it binds itself (`sock`, or the listen address) for
    tests. `should_exit` fires hypercorn's `shutdown_trigger`; `force_exit` drops its
    graceful wait.

    `--header-timeout` is hypercorn's `keep_alive_timeout`: hypercorn arms that one timer
    when a connection opens and whenever it has no request in progress, and stops it only
    when a request's head is complete (h11's Request, h2's RequestReceived, i.e. HEADERS
    with END_HEADERS), never on a read. So a client that trickles the preface, SETTINGS or
    a header block — or sends nothing — is closed `--header-timeout` after it connected or
    after its last request ended (on h2c prior knowledge with the patch in
    `hypercorn_internals.h2c_idle_timer`). The same bound covers the TLS handshake.

    `--body-timeout` is kept by wrapping the app (`body_deadline.BodyDeadline`): hypercorn
    has no body deadline of its own. Request trailers it drops and bounds itself.
    """

    def __init__(self, app: Any, settings: Settings, sock: socket.socket | None = None) -> None:
        from hypercorn.config import Config

        self.app = app
        self.settings = settings
        self.sock = sock
        self.port = settings.listen[1]
        self.config = config = Config()
        config.backlog = 4096
        config.certfile, config.keyfile = settings.certfile, settings.keyfile
        config.alpn_protocols = ["h2", "http/1.1"]
        config.h11_max_incomplete_size = settings.max_header_bytes + 1024
        # Above the proxy's own limit, so an oversized header list gets its 431, not a reset.
        config.h2_max_header_list_size = max(2**16, settings.max_header_bytes + 4096)
        # hypercorn's defaults, named because the flood bounds rest on them: at most 100 apps
        # run per connection, reset streams included (`hypercorn_internals.guard_h2_floods`),
        # and a header block h2 buffers is at most 64 CONTINUATION frames of 16 KiB.
        config.h2_max_concurrent_streams = 100
        config.h2_max_inbound_frame_size = 2**14
        config.include_server_header = False
        config.include_date_header = False
        config.graceful_timeout = 1.0
        # hypercorn 0.18 answers HTTP/2 request 1001 on a connection with GOAWAY naming that
        # very stream, then cannot send its response: the request is lost. Never close for
        # a request count (uvicorn does not either).
        config.keep_alive_max_requests = 2**31
        if settings.header_timeout is not None:
            config.keep_alive_timeout = settings.header_timeout
            config.ssl_handshake_timeout = settings.header_timeout
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.loglevel = settings.log_level.upper()
        self._exit = asyncio.Event()
        self._up = asyncio.Event()

    @property
    def force_exit(self) -> bool:
        return self.config.graceful_timeout == 0

    @force_exit.setter
    def force_exit(self, value: bool) -> None:
        if value:  # read by hypercorn once its shutdown_trigger has fired
            self.config.graceful_timeout = 0.0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        from hypercorn.asyncio import serve

        sock = sockets[0] if sockets else self.sock
        if sock is None:
            host, port = self.settings.listen
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.create_server((host, port), family=family, backlog=4096)
            except OSError as exc:
                logger.error("cannot listen on %s:%d: %s", host, port, exc)
                return
        self.port = sock.getsockname()[1]
        sock.setblocking(False)
        self.config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns and closes it
        bound_h2_stream_buffers()
        h2c_idle_timer()
        guard_h2_floods()
        close_in_time()
        self.started = True
        app: Any = BodyDeadline(self.app, self.settings.body_timeout)
        await serve(app, self.config, shutdown_trigger=self._exit.wait, mode="asgi")
