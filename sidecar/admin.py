"""The admin listener: liveness, readiness, metrics and drain, apart from traffic.

It binds to 127.0.0.1 by default: nothing here needs to be reachable from outside the pod
except by the kubelet, which is given the pod IP by setting `--admin-listen 0.0.0.0:9901`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import httpcore

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.upstream.types import Upstream

HEALTH_CACHE_SECONDS = 1.0
HEALTH_TIMEOUT_SECONDS = 2.0


class UpstreamHealth:
    """Answers "does the upstream's health path say 200?", at most once a second."""

    def __init__(self, upstream: Upstream, path: str) -> None:
        self.upstream = upstream
        self.path = path
        self._checked_at = -HEALTH_CACHE_SECONDS
        self._healthy = False
        self._detail = "not checked yet"
        self._lock = asyncio.Lock()
        uds = upstream.path if upstream.scheme == "unix" else None
        self._pool = httpcore.AsyncConnectionPool(max_connections=1, uds=uds, retries=0)

    async def check(self) -> tuple[bool, str]:
        async with self._lock:
            if time.monotonic() - self._checked_at >= HEALTH_CACHE_SECONDS:
                self._healthy, self._detail = await self._probe()
                self._checked_at = time.monotonic()
        return self._healthy, self._detail

    async def _probe(self) -> tuple[bool, str]:
        url = "http://" + self.upstream.authority.decode() + self.path
        timeouts = {k: HEALTH_TIMEOUT_SECONDS for k in ("connect", "read", "write", "pool")}
        try:
            response = await self._pool.request("GET", url, extensions={"timeout": timeouts})
        except httpcore.TimeoutException:
            return False, f"upstream {self.path} timed out"
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            return False, f"upstream {self.path} unreachable: {exc or type(exc).__name__}"
        if response.status != 200:
            return False, f"upstream {self.path} answered {response.status}"
        return True, "ok"

    async def aclose(self) -> None:
        await self._pool.aclose()


class AdminApp:
    """`/livez`, `/readyz`, `/metrics`, `POST /drain` as a pure ASGI app."""

    def __init__(
        self,
        registry: StreamRegistry,
        health: UpstreamHealth,
        start_drain: Callable[[], None],
        metrics: Callable[[], Awaitable[bytes] | bytes] | None = None,
    ) -> None:
        self.registry = registry
        self.health = health
        self.start_drain = start_drain
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await self.health.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        routes = {"/livez": "GET", "/readyz": "GET", "/metrics": "GET", "/drain": "POST"}
        if path not in routes:
            await _json(
                send, 404, {"error": {"message": f"no admin endpoint {path}", "code": "not_found"}}
            )
        elif method != routes[path] and not (method == "HEAD" and routes[path] == "GET"):
            await _json(
                send,
                405,
                {"error": {"message": f"use {routes[path]}", "code": "method_not_allowed"}},
            )
        elif path == "/livez":
            await _json(send, 200, {"status": "ok"})
        elif path == "/readyz":
            await self._readyz(send)
        elif path == "/metrics":
            await self._metrics(send)
        else:
            self.start_drain()
            await _json(send, 202, {"status": "draining", "active_streams": len(self.registry)})

    async def _readyz(self, send: Send) -> None:
        if self.registry.draining:
            await _json(send, 503, {"status": "draining"})
            return
        healthy, detail = await self.health.check()
        await _json(
            send,
            200 if healthy else 503,
            {"status": "ok" if healthy else "unready", "detail": detail},
        )

    async def _metrics(self, send: Send) -> None:
        if self.metrics is None:
            body = b"# TYPE sidestream_active_streams gauge\nsidestream_active_streams %d\n" % len(
                self.registry
            )
        else:
            produced = self.metrics()
            body = produced if isinstance(produced, bytes) else await produced
        headers = [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, payload: object) -> None:
    body = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
