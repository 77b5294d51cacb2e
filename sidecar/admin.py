"""The admin listener: liveness, readiness, metrics, drain and the live view (`streams_view`),
apart from traffic.

It binds to 127.0.0.1 by default: nothing here needs to be reachable from outside the pod
except by the kubelet, which is given the pod IP by setting `--admin-listen 0.0.0.0:9901`.
Even then only the probes and `/metrics` (`OPEN`) answer anyone; `POST /drain` and the live
view answer loopback peers, or a bearer token (`sidecar.admin_access`), else 403 and
nothing happens. A route not listed in `OPEN` is a control route.

Starlette serves it: these requests are a few a second at most, so routing and responses
are Starlette's; the traffic path stays pure ASGI. Unknown paths and wrong methods answer
the sidecar's JSON error shape, not Starlette's plain-text defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import httpcore
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.admin_access import AdminAccess, AdminToken, peer
from sidecar.streams_view import StreamsView
from sidecar.upstream.h2c import WatchingBackend
from sidecar.upstream.tls import UpstreamTLS
from sidecar.upstream.types import Upstream

Endpoint = Callable[[Request], Awaitable[Response]]

HEALTH_CACHE_SECONDS = 1.0
HEALTH_TIMEOUT_SECONDS = 2.0
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
ROUTES = {  # GET takes HEAD
    "/livez": "GET",
    "/readyz": "GET",
    "/metrics": "GET",
    "/drain": "POST",
    "/streams": "GET",
    "/streams/events": "GET",
    "/": "GET",
}
OPEN = frozenset({"/livez", "/readyz", "/metrics"})  # the kubelet's and Prometheus's: anyone
# Readiness stays as the upstream makes it: resume is optional, and a sidecar in the data path
# must not leave its Service over it. The detail says so, for whoever looks.
STORE_UNREACHABLE = "resume store unreachable (streams go on; resume answers 503 until it is back)"

logger = logging.getLogger("sidestream")


class UpstreamHealth:
    """Answers "does the upstream's health path say 200?", at most once a second."""

    def __init__(self, upstream: Upstream, path: str, tls: UpstreamTLS | None = None) -> None:
        self.upstream = upstream
        self.path = path
        self._checked_at = -HEALTH_CACHE_SECONDS
        self._healthy = False
        self._detail = "not checked yet"
        self._lock = asyncio.Lock()
        uds = upstream.path if upstream.scheme == "unix" else None
        context = (
            (tls or UpstreamTLS()).context(["http/1.1"]) if upstream.scheme == "https" else None
        )
        # The traffic's own protocol: an h2c:// upstream is asked with HTTP/2 prior
        # knowledge, so an upstream that speaks only HTTP/1.1 is unready, and says why.
        h2c = upstream.scheme == "h2c"
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=1,
            uds=uds,
            retries=0,
            ssl_context=context,
            http1=not h2c,
            http2=h2c,
            network_backend=WatchingBackend() if h2c else None,
        )
        self._scheme = "https" if upstream.scheme == "https" else "http"

    async def check(self) -> tuple[bool, str]:
        async with self._lock:
            if time.monotonic() - self._checked_at >= HEALTH_CACHE_SECONDS:
                self._healthy, self._detail = await self._probe()
                self._checked_at = time.monotonic()
        return self._healthy, self._detail

    async def _probe(self) -> tuple[bool, str]:
        url = f"{self._scheme}://{self.upstream.authority.decode()}{self.path}"
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
    """`/livez`, `/readyz`, `/metrics`, `POST /drain`, the live view (`/streams`,
    `/streams/events`, `/`) on Starlette routing (a cold path)."""

    def __init__(
        self,
        registry: StreamRegistry,
        health: UpstreamHealth,
        start_drain: Callable[[], None],
        metrics: Callable[[], Awaitable[bytes] | bytes] | None = None,
        *,
        token: AdminToken | None = None,
        resume_store: object = None,
    ) -> None:
        """`resume_store`: the resume store, whose `failing` (a Redis store's) `/readyz`
        names in its detail."""
        self.registry = registry
        self.resume_store = resume_store
        self.health = health
        self.start_drain = start_drain
        self.metrics = metrics
        self.access = AdminAccess(token)
        self.view = view = StreamsView(registry)
        endpoints = {
            "/livez": self._livez,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/drain": self._drain,
            "/streams": view.streams,
            "/streams/events": view.events,
            "/": view.page,
        }
        routes = []
        for path, method in ROUTES.items():
            endpoint = endpoints[path] if path in OPEN else self._control(endpoints[path])
            routes.append(Route(path, endpoint, methods=[method]))
        self._app = Starlette(
            routes=routes,
            exception_handlers={404: _not_found, 405: _method_not_allowed},
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        await self.health.aclose()

    def _control(self, endpoint: Endpoint) -> Endpoint:
        """`endpoint`, run only when `self.access` allows the peer; else 403, before the
        endpoint runs or any body is read."""

        async def control(request: Request) -> Response:
            if self.access.allows(request.scope):
                return await endpoint(request)
            where = "on loopback, or with the admin token" if self.access.token else "on loopback"
            logger.warning(
                "admin: refused %s %s from %s: it answers only %s",
                request.method,
                request.url.path,
                peer(request.scope),
                where,
            )
            message = f"{request.method} {request.url.path} answers only {where}"
            return _json(403, {"error": {"message": message, "code": "forbidden"}})

        return control

    async def _livez(self, request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def _readyz(self, request: Request) -> Response:
        if self.registry.draining:
            return _json(503, {"status": "draining"})
        healthy, detail = await self.health.check()
        if getattr(self.resume_store, "failing", False):
            detail = f"{detail}; {STORE_UNREACHABLE}"
        return _json(
            200 if healthy else 503,
            {"status": "ok" if healthy else "unready", "detail": detail},
        )

    async def _metrics(self, request: Request) -> Response:
        if self.metrics is None:
            body = b"# TYPE sidestream_active_streams gauge\nsidestream_active_streams %d\n" % len(
                self.registry
            )
        else:
            produced = self.metrics()
            body = produced if isinstance(produced, bytes) else await produced
        return Response(body, media_type=PROMETHEUS_TEXT)

    async def _drain(self, request: Request) -> Response:
        self.start_drain()
        return _json(202, {"status": "draining", "active_streams": len(self.registry)})


def _json(status: int, payload: object, headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse(payload, status, headers={"cache-control": "no-store", **(headers or {})})


async def _not_found(request: Request, exc: Exception) -> Response:
    path = request.url.path
    return _json(404, {"error": {"message": f"no admin endpoint {path}", "code": "not_found"}})


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    method = ROUTES.get(request.url.path, "GET")
    allow = exc.headers if isinstance(exc, HTTPException) and exc.headers else {}
    error = {"message": f"use {method}", "code": "method_not_allowed"}
    return _json(405, {"error": error}, allow)
