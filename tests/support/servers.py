"""Real servers on 127.0.0.1 ephemeral ports, in the test's own event loop.

Starlette's TestClient and httpx's ASGITransport buffer whole responses, so every test
that cares about timing, keep-alives or disconnects runs the app under a real server
from here and talks to it over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator
from typing import Any, Literal

import uvicorn

from middleware.types import ASGIApp
from sidecar.config import load
from sidecar.servers.uvicorn_listener import traffic_protocol

Server = Literal["uvicorn-httptools", "uvicorn-h11", "hypercorn", "sidecar"]
SERVERS: tuple[Server, ...] = ("uvicorn-httptools", "uvicorn-h11", "hypercorn")


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.set_inheritable(True)
    return sock


class _QuietUvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the test runner owns SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serve(
    app: ASGIApp, server: Server = "uvicorn-httptools", host: str = "127.0.0.1", **options: Any
) -> AsyncIterator[int]:
    """Serve `app` on `host` (127.0.0.1, or e.g. ::1) and yield the port; stop the server on
    exit.

    `sidecar` is uvicorn with the sidecar's HTTP/1.1 protocol
    (`sidecar.servers.http1`), which also offers the `SEND_NOWAIT` extension:
    serve the sidecar's app with it."""
    sock = bound_socket(host)
    port = int(sock.getsockname()[1])
    if server == "hypercorn":
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.loglevel = "WARNING"
        config.graceful_timeout = 1.0
        for key, value in options.items():
            setattr(config, key, value)
        stop = asyncio.Event()
        task = asyncio.create_task(hypercorn_serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        await wait_listening(port, host=host)
        try:
            yield port
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            sock.detach()  # hypercorn closed the descriptor itself
        return

    default_http: Any = {"uvicorn-httptools": "httptools", "uvicorn-h11": "h11"}.get(server)
    if server == "sidecar":  # uvicorn with the sidecar's protocol and defaults, as it runs them
        default_http = traffic_protocol(load(["--upstream", "http://127.0.0.1:1"], environ={}))
        options = {"server_header": False, "date_header": False, "proxy_headers": False, **options}
    http = options.pop("http", default_http)
    uv_config = uvicorn.Config(
        app, http=http, lifespan="auto", log_level="warning", timeout_graceful_shutdown=1, **options
    )
    uv = _QuietUvicorn(uv_config)
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield port
    finally:
        uv.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def wait_listening(port: int, attempts: int = 400, host: str = "127.0.0.1") -> None:
    """Return once `host`:`port` accepts a connection (5 ms between tries)."""
    for _ in range(attempts):
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.005)
            continue
        writer.close()
        return
    raise TimeoutError(f"nothing listens on port {port}")
