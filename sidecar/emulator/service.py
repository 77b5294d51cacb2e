"""The emulator's ASGI app: routing and the paced token producer.

Raw ASGI, no framework: the emulator must never be the bottleneck of a proxy benchmark.
A content token costs one bytes concatenation and one `send()`. The closing events (finish
chunk, usage chunk, `[DONE]`) go out together in one last `send()`: one write, several events.

Disconnects: once the request body is read, a watcher task waits on `receive()`; on
`http.disconnect` it cancels the producing task at once (uvicorn drops `send()` after a
disconnect silently, so `send()` would never tell). The producer treats that cancellation
as "client gone": it counts it in `stats` and returns normally.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from middleware.types import Receive, Scope, Send
from sidecar.emulator.asgi import (
    CORS,
    ClientGone,
    Watch,
    error,
    lifespan,
    read_body,
    read_headers,
    respond,
)
from sidecar.emulator.frames import DONE, STAMP, USAGE_FIELD, Frames, full_response
from sidecar.emulator.plan import BadRequest, Headers, Plan, plan_get, plan_post
from sidecar.emulator.text import token_cycle

MAX_BODY = 4 * 1024 * 1024
YIELD_EVERY = 16  # with no delay between tokens, let other streams run every this many tokens
SSE = b"text/event-stream; charset=utf-8"


@dataclass
class Stats:
    """What the emulator saw; tests and benchmarks read it (in-process or `/debug/stats`)."""

    streams_started: int = 0
    streams_completed: int = 0
    streams_cancelled: int = 0
    cancel_times: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    last_event_id: str | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "streams_started": self.streams_started,
            "streams_completed": self.streams_completed,
            "streams_cancelled": self.streams_cancelled,
            "streams_active": self.streams_started
            - self.streams_completed
            - self.streams_cancelled,
            "cancel_times": list(self.cancel_times),  # time.monotonic() when each cancel was seen
            "now": time.monotonic(),
        }

    def reset(self) -> None:
        self.streams_started = self.streams_completed = self.streams_cancelled = 0
        self.cancel_times.clear()
        self.last_event_id = None


stats = Stats()


class Emulator:
    """The ASGI app. Holds configuration only; per-request state lives in locals."""

    def __init__(
        self, *, stats: Stats = stats, max_body: int = MAX_BODY, model: str = "emulator"
    ) -> None:
        self.stats = stats
        self.max_body = max_body
        self.model = model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        allowed = ROUTES.get(path)
        if allowed is None:
            await error(send, 404, f"Invalid URL ({method} {path})", code="not_found")
            return
        if method != allowed:
            message = f"Method {method} not allowed on {path}; use {allowed}."
            allow = [(b"allow", allowed.encode())]
            await error(send, 405, message, code="method_not_allowed", extra=allow)
            return
        try:
            headers, length = read_headers(scope)
            if headers.last_event_id is not None:
                self.stats.last_event_id = headers.last_event_id
            body = await read_body(receive, self.max_body, length)
            await self._route(path, scope, body, headers, receive, send)
        except BadRequest as exc:
            await error(send, exc.status, exc.message, exc.param, exc.code)
        except ClientGone:
            pass

    async def _route(
        self, path: str, scope: Scope, body: bytes, headers: Headers, receive: Receive, send: Send
    ) -> None:
        if path == "/v1/chat/completions" or path == "/v1/completions":
            plan = plan_post(
                "chat" if path == "/v1/chat/completions" else "completion", body, headers
            )
            if plan.stream:
                await self._stream(plan, receive, send)
            else:
                await self._complete(plan, receive, send)
        elif path == "/v1/stream":
            plan, start = plan_get(scope["query_string"], headers)
            if start > plan.count:  # past the finish event: 204 tells EventSource to stop
                await respond(send, 204, b"", extra=[CORS])
            else:
                await self._stream(plan, receive, send, start, ids=True)
        elif path == "/v1/models":
            await respond(send, 200, _models(self.model))
        elif path == "/health":
            await respond(send, 200, b"")
        elif path == "/debug/stats":
            await respond(send, 200, json.dumps(self.stats.snapshot()).encode(), extra=[CORS])
        else:  # /debug/last-event-id
            body = json.dumps({"last_event_id": self.stats.last_event_id}).encode()
            await respond(send, 200, body, extra=[CORS])

    async def _stream(
        self, plan: Plan, receive: Receive, send: Send, start: int = 0, ids: bool = False
    ) -> None:
        """Stream `plan` as SSE. With `ids`, content event n carries `id: n` (finish: count)."""
        frames = Frames(plan)
        _, tokens = token_cycle(plan.text)
        cycle = len(tokens)
        head, tail, end, count, itl = frames.head, frames.tail, frames.end, plan.count, plan.itl
        loop = asyncio.get_running_loop()
        self.stats.streams_started += 1
        watch = Watch(receive)
        try:
            headers = [(b"content-type", SSE)]
            if ids:
                headers += [(b"cache-control", b"no-cache"), CORS]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if frames.role is not None and start == 0:
                await send({"type": "http.response.body", "body": frames.role, "more_body": True})
            first = loop.time() + plan.ttft
            for i in range(start, count):
                delay = first + (i - start) * itl - loop.time() if itl or i == start else 0.0
                if delay > 0:
                    await asyncio.sleep(delay)
                elif (i - start) % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)
                if plan.stamp is None:
                    chunk = head + tokens[i % cycle] + tail + end
                elif plan.stamp == "content":
                    chunk = head + b'"%d"' % time.monotonic_ns() + tail + end
                else:
                    chunk = head + tokens[i % cycle] + tail + STAMP % time.monotonic_ns() + end
                if plan.continuous_usage:  # vLLM's usage so far, after the choices
                    used = (plan.prompt_tokens, i + 1, plan.prompt_tokens + i + 1)
                    chunk = chunk[:-3] + USAGE_FIELD % used + b"}\n\n"
                if ids:
                    chunk = b"id: %d\n" % i + chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            done = frames.finish(plan.finish_reason)
            if ids:
                done = b"id: %d\n" % count + done
            if plan.include_usage:
                done += frames.usage(plan.prompt_tokens, count)
            watch.stop()  # from here on the stream is complete, whatever the client does
            await send({"type": "http.response.body", "body": done + DONE, "more_body": False})
        except asyncio.CancelledError:
            if not watch.absorb():
                raise
            self.stats.streams_cancelled += 1
            self.stats.cancel_times.append(time.monotonic())
            return
        finally:
            watch.stop()
        self.stats.streams_completed += 1

    async def _complete(self, plan: Plan, receive: Receive, send: Send) -> None:
        """Answer non-streaming: wait as long as generating would take, then send it all."""
        texts, _ = token_cycle(plan.text)
        text = "".join(texts[i % len(texts)] for i in range(plan.count))
        watch = Watch(receive)
        try:
            delay = plan.ttft + plan.itl * max(plan.count - 1, 0)
            if delay > 0:
                await asyncio.sleep(delay)
            watch.stop()
        except asyncio.CancelledError:
            if not watch.absorb():
                raise
            return
        finally:
            watch.stop()
        await respond(send, 200, full_response(plan, text))


ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/stream": "GET",
    "/v1/models": "GET",
    "/health": "GET",
    "/debug/stats": "GET",
    "/debug/last-event-id": "GET",
}


def _models(model: str) -> bytes:
    entry = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "sidestream"}
    return json.dumps({"object": "list", "data": [entry]}).encode()
