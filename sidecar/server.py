"""Run the sidecar: the guarded proxy on the traffic port, the admin app beside it, one loop.

The traffic port is served by uvicorn (HTTP/1.1), or with `--http2` by hypercorn: HTTP/1.1
and HTTP/2 on the same port — h2c with prior knowledge in cleartext, ALPN `h2`/`http/1.1`
with TLS. The admin port is always uvicorn.

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
import socket
import sys
from collections.abc import Generator
from typing import Any, Protocol

import uvicorn

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.config import Settings
from sidecar.inbound import GuardedHttpToolsProtocol, protocol_class
from sidecar.proxy import ProxyApp

logger = logging.getLogger("sidestream")

HEAD_SLACK_BYTES = 8192  # the request line and framing on top of --max-header-bytes
DRAIN_GRACE_SECONDS = 0.5  # for streams ended by the drain to write their terminal event


class _ExitEvent:
    """`should_exit` kept as an asyncio.Event, so serving can wait for it instead of polling;
    setting it True sets the event (once set it stays set, as a stop cannot be taken back)."""

    _exit: asyncio.Event

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()


class _Server(_ExitEvent, uvicorn.Server):
    """uvicorn without its own signal handlers (the Sidecar decides what a signal means) and
    without its 10 Hz poll of `should_exit`: the main loop waits on an event the flag sets,
    so an idle sidecar is never woken (two polling servers cost ~20 wake-ups and 1.4 ms of
    CPU a second, and that was a measurable share of a benchmark window). uvicorn's tick
    also refreshes the date header once a second; the sidecar sends none."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        # One tick sets the default headers (none: no date, no server header); uvicorn's other
        # per-tick duty, `limit_max_requests`, is never configured by the sidecar.
        await self.on_tick(0)
        await self._exit.wait()


class Listener(Protocol):
    """What the Sidecar needs of a server: serve until told to exit."""

    should_exit: bool
    force_exit: bool
    started: bool

    async def serve(self) -> None: ...


class HypercornListener(_ExitEvent):
    """hypercorn's asyncio `serve()` behind uvicorn.Server's three flags.

    The socket is bound here (or given, bound, by a test), before hypercorn starts, so a
    port in use fails like uvicorn (logged, exit status 1), and `started` means listening.
    `should_exit` fires hypercorn's `shutdown_trigger`; `force_exit` drops its graceful wait.
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
        config.include_server_header = False
        config.include_date_header = False
        config.graceful_timeout = 1.0
        # hypercorn 0.18 answers HTTP/2 request 1001 on a connection with GOAWAY naming that
        # very stream, then cannot send its response: the request is lost. Never close for
        # a request count (uvicorn does not either).
        config.keep_alive_max_requests = 2**31
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.loglevel = settings.log_level.upper()
        self.started = False
        self._exit = asyncio.Event()

    @property
    def force_exit(self) -> bool:
        return self.config.graceful_timeout == 0

    @force_exit.setter
    def force_exit(self, value: bool) -> None:
        if value:  # read by hypercorn once its shutdown_trigger has fired
            self.config.graceful_timeout = 0.0

    async def serve(self) -> None:
        from hypercorn.asyncio import serve

        sock = self.sock
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
        self.started = True
        await serve(self.app, self.config, shutdown_trigger=self._exit.wait)


def bound_h2_stream_buffers() -> None:
    """Make hypercorn's per-stream HTTP/2 send buffer hold a writer back (idempotent).

    hypercorn 0.17-0.18 `StreamBuffer.pop` wakes a writer paused at the high-water mark when
    the chunk it *took* is small, not when what is *left* is. A client that stops opening a
    stream's window gets `pop(0)` for every write, so the app is never held back and the
    buffer grows without bound — the upstream is never paused for a slow HTTP/2 client. The
    replacement wakes the writer once the buffer is under the low-water mark. Patched when
    `--http2` starts serving, never on import.
    """
    from hypercorn.protocol import h2 as hyper_h2

    if getattr(hyper_h2.StreamBuffer, "sidestream_bounded", False):
        return
    low_water = hyper_h2.BUFFER_LOW_WATER

    class StreamBuffer(hyper_h2.StreamBuffer):
        sidestream_bounded = True

        async def pop(self, max_length: int) -> bytes:
            buffer: bytearray = self.buffer
            data = bytes(buffer[:max_length])
            del buffer[:max_length]
            if len(buffer) < low_water:
                await self._paused.set()
            if not buffer:
                await self._is_empty.set()
            return data

    hyper_h2.StreamBuffer = StreamBuffer  # type: ignore[misc]


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit: every stream holds two sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def traffic_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """The traffic listener's HTTP/1.1 protocol for these settings (`sidecar.inbound`)."""
    return protocol_class(settings.header_timeout, settings.max_header_bytes + HEAD_SLACK_BYTES)


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

    def _config(self, app: Any, listen: tuple[str, int], **extra: Any) -> uvicorn.Config:
        level = self.settings.log_level
        extra.setdefault("http", "httptools")
        return uvicorn.Config(
            app,
            host=listen[0],
            port=listen[1],
            lifespan="on",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            log_level=level,
            log_config=None,
            timeout_graceful_shutdown=1,
            **extra,
        )

    async def serve(self) -> None:
        s = self.settings
        traffic: Listener
        if s.http2:
            traffic = HypercornListener(self.guard, s)
        else:
            traffic = _Server(
                self._config(
                    self.guard,
                    s.listen,
                    backlog=4096,
                    http=traffic_protocol(s),
                    ssl_certfile=s.certfile,
                    ssl_keyfile=s.keyfile,
                )
            )
        admin = _Server(self._config(self.admin, s.admin_listen))
        self.servers = [traffic, admin]
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
