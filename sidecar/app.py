"""Run the sidecar: the guarded proxy on the traffic port, the admin app beside it, one loop.

The traffic port is served by uvicorn (HTTP/1.1), or with `--http2` by hypercorn: HTTP/1.1
and HTTP/2 on the same port — h2c with prior knowledge in cleartext, ALPN `h2`/`http/1.1`
with TLS. The admin port is always uvicorn. How each server is set up lives in
`sidecar.servers`; this module builds the apps and owns the process: signals, drain,
RLIMIT_NOFILE.

Shutdown is sidestream's, not the server's: SIGTERM (or `POST /drain`) marks the process
not-ready, refuses new requests with 503, lets in-flight streams run up to the drain
timeout, ends the rest with a retryable terminal event, then stops both listeners and
exits 0. A second SIGTERM or SIGINT ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import sys
from typing import Any

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.config import Settings
from sidecar.proxy import ProxyApp
from sidecar.servers.hypercorn_listener import HypercornListener
from sidecar.servers.listener import Listener
from sidecar.servers.uvicorn_listener import admin_server, traffic_server, use_internals

logger = logging.getLogger("sidestream")

DRAIN_GRACE_SECONDS = 0.5  # for streams ended by the drain to write their terminal event


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit: every stream holds two sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def build_guard(settings: Settings, registry: StreamRegistry, telemetry: Any = None) -> StreamGuard:
    proxy = ProxyApp(
        settings.upstream,
        max_body=settings.max_body,
        max_header_bytes=settings.max_header_bytes,
        connect_timeout=settings.connect_timeout,
    )
    options: dict[str, Any] = {"telemetry": telemetry} if telemetry is not None else {}
    return StreamGuard(
        proxy,
        keepalive_interval=settings.keepalive_interval,
        first_token_timeout=settings.first_token_timeout,
        idle_timeout=settings.idle_timeout,
        max_duration=settings.max_duration,
        send_timeout=settings.send_timeout,
        max_streams=settings.max_streams,
        registry=registry,
        **options,
    )


class Sidecar:
    """The process: two listeners, one registry of in-flight requests, one drain."""

    def __init__(self, settings: Settings, telemetry: Any = None) -> None:
        self.settings = settings
        self.registry = StreamRegistry()
        self.guard = build_guard(settings, self.registry, telemetry)
        self.health = UpstreamHealth(settings.upstream, settings.upstream_health)
        metrics = getattr(telemetry, "prometheus_text", None)
        self.admin = AdminApp(self.registry, self.health, self.start_drain, metrics)
        self.servers: list[Listener] = []
        self._drain: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    async def serve(self) -> None:
        s = self.settings
        internals = use_internals()
        traffic: Listener
        if s.http2:
            traffic = HypercornListener(self.guard, s)
        else:
            traffic = traffic_server(self.guard, s, internals=internals)
        self.servers = [traffic, admin_server(self.admin, s, internals=internals)]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        tasks = [asyncio.create_task(server.serve()) for server in self.servers]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for server in self.servers:  # one listener failed or stopped: stop the other too
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if any(not server.started for server in self.servers) and self._drain is None:
            raise SystemExit(1)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._drain is None:
            logger.info("%s: draining for up to %ss", sig.name, self.settings.drain_timeout)
            self.start_drain()
        else:
            logger.info("%s again: stopping now", sig.name)
            self.stop(force=True)

    def start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_stop())

    async def _drain_then_stop(self) -> None:
        await self.registry.drain(self.settings.drain_timeout, grace=DRAIN_GRACE_SECONDS)
        self.stop(force=False)

    def stop(self, *, force: bool) -> None:
        if force:
            self.registry.shut_down_all()
        for server in self.servers:
            server.should_exit = True
            server.force_exit = force


def run(settings: Settings, telemetry: Any = None) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    limit = raise_nofile_limit()
    logger.info(
        "sidestream on %s:%d -> %s (admin %s:%d, %d file descriptors)",
        *settings.listen,
        settings.upstream,
        *settings.admin_listen,
        limit,
    )
    # Everything alive now (modules, the SDK, config) lives as long as the process: keep it
    # out of the cyclic collector's scans, so collections cost what the streams allocate.
    gc.collect()
    gc.freeze()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(Sidecar(settings, telemetry).serve())
    else:
        uvloop.run(Sidecar(settings, telemetry).serve())
    return 0
