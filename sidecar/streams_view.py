"""The live view: the streams in flight, on the admin listener.

`GET /streams` answers JSON, one entry per request in flight: request id, model, path, age,
response phase, tokens so far (with telemetry on), time to first token, time since the last
upstream chunk, keep-alives written and the client's address. `GET /streams/events` sends
the same as SSE, one snapshot every `EVENTS_INTERVAL` seconds, and `GET /` serves the page
(`live.html`, no CDN, no build step) that shows it as a table.

Who may see it: loopback, or the admin token (`sidecar.admin_access`, checked by `admin`).

Bounded: at most `MAX_WATCHERS` event streams at once (past it 503 + `Retry-After`: each
one walks the registry every second for up to ten minutes); at most `MAX_ENTRIES` entries
(`?limit=` chooses fewer), the ones longest without a chunk first (the stuck ones), and the
total count beside them. A snapshot is a walk over the registry's set and a partial sort,
on the admin listener's request: nothing here runs per chunk, and the facts come off the
cycles' own attributes (the guard's core knows nothing of this module). Never headers or
bodies: the request id (`X-Request-ID`, capped) and the model (parsed by telemetry from the
body's top level) are the only request fields.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import time
from collections.abc import AsyncIterator
from importlib import resources
from operator import attrgetter
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from middleware.cycle import Cycle
from middleware.registry import StreamRegistry
from middleware.telemetry import semconv

MAX_ENTRIES = 100  # the most entries a snapshot lists, whatever `?limit=` asks
EVENTS_INTERVAL = 1.0  # seconds between snapshots on /streams/events
EVENTS_LIFETIME = 600.0  # a feed ends after this (EventSource reconnects by itself)
MAX_WATCHERS = 8  # event streams open at once; past it 503 (a view is for a person or two)
WATCHERS_RETRY_AFTER = 10  # seconds, in the 503's Retry-After
FIELD_CAP = 128  # characters kept of the request id, model and path
PAGE = "live.html"


class BadLimit(ValueError):
    """`?limit=` is not a whole number."""


def parse_limit(value: str | None) -> int:
    """The entries to list: `MAX_ENTRIES` by default, `value` clamped to [0, MAX_ENTRIES]."""
    if value is None or value == "":
        return MAX_ENTRIES
    try:
        limit = int(value)
    except ValueError:
        raise BadLimit(f"limit must be a whole number, not {value[:32]!r}") from None
    return max(0, min(limit, MAX_ENTRIES))


def snapshot(registry: StreamRegistry, limit: int = MAX_ENTRIES) -> dict[str, Any]:
    """The in-flight requests of `registry`: the total, and up to `limit` entries, the
    longest without an upstream chunk first."""
    now = time.monotonic()
    cycles = [c for c in registry.requests() if isinstance(c, Cycle)]
    oldest = heapq.nsmallest(max(0, min(limit, MAX_ENTRIES)), cycles, key=attrgetter("last_chunk"))
    return {
        "total": len(cycles),
        "limit": limit,
        "streams": [entry(cycle, now) for cycle in oldest],
    }


def entry(cycle: Cycle, now: float) -> dict[str, Any]:
    """What the view shows of one request: never a header (but its id) or a body byte."""
    since = now - cycle.last_chunk
    keepalive = cycle.settings.timeouts.keepalive_interval
    first = cycle.first_token_at
    return {
        "request_id": _request_id(cycle),
        "model": _model(cycle),
        "path": str(cycle.scope.get("path", ""))[:FIELD_CAP],
        "age_s": round(now - cycle.started, 3),
        "phase": cycle.phase.value,
        "streaming": cycle.streaming,
        "tokens": _tokens(cycle),
        "ttft_s": None if first is None else round(first - cycle.started, 3),
        "since_last_chunk_s": round(since, 3),
        "keepalives": cycle.keepalives,
        "client": _client(cycle.scope.get("client")),
        "stuck": keepalive is not None and since > keepalive,
    }


def _request_id(cycle: Cycle) -> str | None:
    record = getattr(cycle, "record", None)  # telemetry's: the id its access line carries
    if record is not None:
        return str(record.request_id)[:FIELD_CAP]
    for key, value in cycle.scope.get("headers", ()):
        if key == b"x-request-id":
            return bytes(value[:FIELD_CAP]).decode("latin-1") or None
    return None


def _model(cycle: Cycle) -> str | None:
    record = getattr(cycle, "record", None)
    model = record.request.get(semconv.GEN_AI_REQUEST_MODEL) if record is not None else None
    return model[:FIELD_CAP] if isinstance(model, str) else None


def _tokens(cycle: Cycle) -> int | None:
    stream_stats = getattr(cycle, "stream_stats", None)  # telemetry's counts, when it is on
    stats = stream_stats() if stream_stats is not None else None
    return None if stats is None else int(stats.tokens)


def _client(client: Any) -> str | None:
    if not client:
        return None
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class StreamsView:
    """The admin endpoints of the live view, over one registry."""

    def __init__(self, registry: StreamRegistry) -> None:
        self.registry = registry
        self.watchers = 0  # event streams open now, at most MAX_WATCHERS

    async def streams(self, request: Request) -> Response:
        try:
            limit = parse_limit(request.query_params.get("limit"))
        except BadLimit as exc:
            error = {"message": str(exc), "code": "bad_limit"}
            return JSONResponse({"error": error}, 400, headers=NO_STORE)
        return JSONResponse(snapshot(self.registry, limit), headers=NO_STORE)

    async def events(self, request: Request) -> Response:
        try:
            limit = parse_limit(request.query_params.get("limit"))
        except BadLimit as exc:
            error = {"message": str(exc), "code": "bad_limit"}
            return JSONResponse({"error": error}, 400, headers=NO_STORE)
        return _Watch(self, self._feed(limit))

    async def _feed(self, limit: int) -> AsyncIterator[bytes]:
        """A snapshot every EVENTS_INTERVAL until the client leaves (Starlette cancels this
        when it hears the disconnect), the sidecar drains, or EVENTS_LIFETIME has passed."""
        yield b"retry: 2000\n\n"
        ends = time.monotonic() + EVENTS_LIFETIME
        while time.monotonic() < ends and not self.registry.draining:
            data = json.dumps(snapshot(self.registry, limit), separators=(",", ":"))
            yield f"event: streams\ndata: {data}\n\n".encode()
            await asyncio.sleep(EVENTS_INTERVAL)

    async def page(self, request: Request) -> Response:
        body = resources.files("sidecar").joinpath(PAGE).read_bytes()
        return Response(body, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


class _Watch(StreamingResponse):
    """The event stream, holding one of the view's MAX_WATCHERS places while it is served:
    taken and given back around the whole response, so a client that leaves at any point
    (before the first byte too) gives its place back."""

    def __init__(self, view: StreamsView, feed: AsyncIterator[bytes]) -> None:
        headers = {**NO_STORE, "x-accel-buffering": "no"}
        super().__init__(feed, media_type="text/event-stream", headers=headers)
        self.view = view

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.view.watchers >= MAX_WATCHERS:  # checked and taken with no await between
            error = {
                "message": f"{MAX_WATCHERS} clients already follow /streams/events",
                "code": "too_many_watchers",
            }
            headers = {**NO_STORE, "retry-after": str(WATCHERS_RETRY_AFTER)}
            await JSONResponse({"error": error}, 503, headers=headers)(scope, receive, send)
            return
        self.view.watchers += 1
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.view.watchers -= 1


NO_STORE = {"cache-control": "no-store"}
PAGE_HEADERS = {
    **NO_STORE,
    # Everything is inline; nothing may load from elsewhere.
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:"
    ),
}
