"""Run the sidecar: the guarded proxy on the traffic port, the admin app beside it, one loop.

Start-up binds every listener before any serves (`sidecar.servers.sockets`): a port in use or
a certificate that does not load ends it with one line on stderr and exit status 1, while no
port accepts. Once every listener is up, `--ready-file` gets the bound addresses as JSON
(`{"listen": "HOST:PORT", "admin": "HOST:PORT" or null, "version", "core", "python"}`,
written to a temporary file and renamed), so a wrapper or a test can use port 0.

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
import dataclasses
import gc
import inspect
import json
import logging
import os
import resource
import signal
import socket
import sys
from typing import Any

from middleware.guard import StreamGuard
from middleware.probe import ProbeApp
from middleware.registry import StreamRegistry
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.build_info import build_info, with_build_info
from sidecar.config import Settings, version
from sidecar.probe.route import ProbeRoute
from sidecar.proxy import ProxyApp
from sidecar.servers.hypercorn_listener import HypercornListener
from sidecar.servers.listener import Listener
from sidecar.servers.sockets import (
    StartupError,
    bind_all,
    bound_address,
    check_certificate,
    close_all,
    listen_all,
)
from sidecar.servers.uvicorn_listener import admin_server, traffic_server, use_internals
from sidecar.speedups import running
from sidecar.upstream.tls import UpstreamTLS

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
        tls=upstream_tls(settings),
    )
    probe = ProbeApp(keepalive_interval=settings.keepalive_interval) if settings.probe else None
    options: dict[str, Any] = {"telemetry": telemetry} if telemetry is not None else {}
    if settings.resume:
        options["resume"] = build_resume(settings, telemetry)
    guard = StreamGuard(
        ProbeRoute(proxy, probe),
        keepalive_interval=settings.keepalive_interval,
        first_token_timeout=settings.first_token_timeout,
        idle_timeout=settings.idle_timeout,
        max_duration=settings.max_duration,
        send_timeout=settings.send_timeout,
        max_streams=settings.max_streams,
        registry=registry,
        usage=settings.usage,
        **options,
    )
    if settings.max_body is not None:
        # Forced usage reads a chat body before the proxy counts it: never past --max-body.
        limit = min(settings.max_body, guard.settings.usage_body_limit)
        guard.settings = dataclasses.replace(guard.settings, usage_body_limit=limit)
    return guard


def build_resume(settings: Settings, telemetry: Any = None) -> Any:
    from middleware.resume import Resume

    tracer = None
    provider = getattr(telemetry, "tracer_provider", None)
    if provider is not None:
        from middleware.telemetry.resume_spans import ResumeSpans

        tracer = ResumeSpans(provider)
    secret, password = settings.resume_secret_file, settings.resume_store_password_file
    return Resume(
        settings.resume_store,
        grace=settings.resume_grace,
        ttl=settings.resume_ttl,
        max_bytes=settings.resume_max_bytes,
        memory=settings.resume_memory,
        keepalive=settings.keepalive_interval,
        tracer=tracer,
        secret=None if secret is None else secret.value,
        credential_headers=settings.resume_credential_headers,
        store_password=None if password is None else password.value.decode(),
        store_ca=settings.resume_store_ca,
    )


def with_resume_metrics(metrics: Any, resume: Any, registry: StreamRegistry) -> Any:
    """`/metrics` with the resume metrics after telemetry's (or the active streams gauge)."""

    async def combined() -> bytes:
        text = b"# TYPE sidestream_active_streams gauge\nsidestream_active_streams %d\n" % len(
            registry
        )
        if metrics is not None:
            produced = metrics()
            text = await produced if inspect.isawaitable(produced) else produced
        return bytes(text) + bytes(resume.prometheus_text())

    return combined


def upstream_tls(settings: Settings) -> UpstreamTLS:
    return UpstreamTLS(ca=settings.upstream_ca, insecure=settings.upstream_insecure)


class Sidecar:
    """The process: two listeners, one registry of in-flight requests, one drain."""

    def __init__(self, settings: Settings, telemetry: Any = None) -> None:
        self.settings = settings
        self.registry = StreamRegistry()
        self.guard = build_guard(settings, self.registry, telemetry)
        self.health = UpstreamHealth(
            settings.upstream, settings.upstream_health, upstream_tls(settings)
        )
        metrics = getattr(telemetry, "prometheus_text", None)
        if self.guard.resume is not None:
            metrics = with_resume_metrics(metrics, self.guard.resume, self.registry)
        metrics = with_build_info(metrics, self.registry)
        resume: Any = self.guard.resume  # middleware.resume.Resume: `/readyz` names its store
        store = None if resume is None else resume.store
        self.admin = AdminApp(
            self.registry,
            self.health,
            self.start_drain,
            metrics,
            token=settings.admin_token_file,
            resume_store=store,
        )
        self.servers: list[Listener] = []
        self._drain: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    async def serve(self, sockets: dict[str, socket.socket]) -> None:
        """Serve the listening sockets by flag (`listen`, and `admin-listen` unless off)."""
        s = self.settings
        internals = use_internals()
        traffic: Listener
        if s.http2:
            traffic = HypercornListener(self.guard, s)
        else:
            traffic = traffic_server(self.guard.handle, s, internals=internals)
        self.servers = [traffic]
        if "admin-listen" in sockets:
            self.servers.append(admin_server(self.admin, s, internals=internals))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        order = [
            sockets["listen"],
            *([sockets["admin-listen"]] if "admin-listen" in sockets else []),
        ]
        tasks = [
            asyncio.create_task(server.serve(sockets=[sock]))
            for server, sock in zip(self.servers, order, strict=True)
        ]
        up = asyncio.create_task(self._announce(sockets))
        resume: Any = self.guard.resume  # middleware.resume.Resume
        checked = None if resume is None else asyncio.create_task(resume.store.ping())
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        up.cancel()
        if checked is not None:
            checked.cancel()
        for server in self.servers:  # one listener failed or stopped: stop the other too
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if any(not server.started for server in self.servers) and self._drain is None:
            raise SystemExit(1)

    async def _announce(self, sockets: dict[str, socket.socket]) -> None:
        """Once every listener is up: the ready file."""
        for server in self.servers:
            await server.wait_started()
        if self.settings.ready_file is not None:
            admin = sockets.get("admin-listen")
            write_ready_file(
                self.settings.ready_file,
                {
                    "listen": bound_address(sockets["listen"]),
                    "admin": bound_address(admin) if admin is not None else None,
                    **build_info(),
                },
            )

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


def write_ready_file(path: str, addresses: dict[str, str | None]) -> None:
    """Write `addresses` as JSON to `path` atomically: a reader sees all of it or nothing."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        json.dump(addresses, file)
        file.write("\n")
    os.replace(temporary, path)


def open_listeners(settings: Settings) -> dict[str, socket.socket]:
    """Check the certificate, bind every listener, then make them all listen (StartupError
    before any listens)."""
    check_certificate(settings.certfile, settings.keyfile)
    addresses = {"listen": settings.listen}
    if settings.admin_listen is not None:
        addresses["admin-listen"] = settings.admin_listen
    sockets = bind_all(addresses)
    listen_all(sockets)
    return sockets


def run(settings: Settings, telemetry: Any = None) -> int:
    """Run until stopped: 0 after a drain or a signal, 1 when start-up fails (one line)."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        sockets = open_listeners(settings)
    except StartupError as exc:
        sys.stderr.write(f"sidestream: error: {exc}\n")
        return 1
    limit = raise_nofile_limit()
    admin = sockets.get("admin-listen")
    logger.info(
        "sidestream %s (%s) on %s -> %s (admin %s, %d file descriptors)",
        version(),
        running(),
        bound_address(sockets["listen"]),
        settings.upstream,
        bound_address(admin) if admin is not None else "off",
        limit,
    )
    if settings.upstream_insecure:
        logger.warning(
            "--upstream-insecure: the upstream's TLS certificate is NOT checked; "
            "anyone on the path can read and change the traffic (for tests only)"
        )
    # Everything alive now (modules, the SDK, config) lives as long as the process: keep it
    # out of the cyclic collector's scans, so collections cost what the streams allocate.
    gc.collect()
    gc.freeze()
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvicorn[standard] brings it
            asyncio.run(Sidecar(settings, telemetry).serve(sockets))
        else:
            uvloop.run(Sidecar(settings, telemetry).serve(sockets))
    finally:
        close_all(sockets)
    return 0
