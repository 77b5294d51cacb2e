"""StreamGuard: pure-ASGI middleware that keeps token streams healthy on their way to the reader.

`StreamGuard.__call__` admits a request (or refuses it: draining, too many in flight) and
runs it as one `Cycle`; the middleware instance holds configuration and the process-wide
`StreamRegistry` only. The cycle runs the inner app in the server's own task and, for a
streaming response, relays each chunk as the app sends it.

Deliberate choices — do not "fix" these:

- The inner app runs in the request's own task, and the guard cancels that task itself
  (then uncancels it, as `asyncio.timeout` does) to stop the app on a disconnect or a timeout.
  No extra task per request, and leaving the app's upstream context closes the upstream.
- One lazy timer per stream serves every deadline: a chunk only stores the clock; the timer,
  when it fires, asks `deadlines` what is due and re-arms itself. No timer object is created
  per chunk, nor per stream: the streams' timers are places in one heap per event loop
  under one loop timer (`middleware.timers`), as thousands of idle streams wait at once.
- Keep-alives are written by a short task started by that timer, never concurrently with the
  app's own write (the app's `send` waits for it): one writer at a time.
- The timer never interrupts an upstream read: cancelling an httpcore read closes its
  connection, so only a real expiry cancels.
- Telemetry is chosen once, here: a `telemetry` object supplies the cycle class every request
  runs with (its own subclass of `Cycle`). The guard core never imports telemetry.
- It needs an asyncio loop (uvicorn, hypercorn's asyncio worker); trio is not supported.
- A resume reader is admitted as a stream is: it holds a slot of `max_streams` until its
  answer ends, and is refused (503, `Retry-After`) past the limit and while draining. A stop
  (`DELETE` on a stream's URL) is admitted always: answered at once, it holds no slot, and it
  ends a generation — refusing it under load or in a drain would keep the upstream busy for
  a client that asked it to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

from middleware.cycle import Cycle, GuardSettings, Resumer
from middleware.deadlines import Timeouts
from middleware.errors import Draining, ShuttingDown, TooManyStreams
from middleware.registry import StreamRegistry
from middleware.stream_response import error_response
from middleware.types import ASGIApp, Message, Receive, Scope, Send
from middleware.usage import MODES

logger = logging.getLogger("sidestream")

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"


class Observer(Protocol):
    """What the guard asks of a telemetry object (`middleware.telemetry.Telemetry`)."""

    @property
    def cycle_class(self) -> type[Cycle]:
        """The Cycle subclass that observes each request."""

    def watch(self, registry: StreamRegistry) -> None:
        """Report this registry's requests in flight."""


class Resume(Resumer, Protocol):
    """What the guard asks of resume (`middleware.resume.Resume`)."""

    def route(self, scope: Scope) -> ASGIApp | None:
        """The responder for a resume or stop request, else None: never forwarded."""

    def is_stop(self, scope: Scope) -> bool:
        """Whether a request `route` took is a stop (it holds no stream), not a reader."""


class StreamGuard:
    """Wrap an ASGI app so its SSE / NDJSON responses stream safely.

    Every timeout is in seconds; `None` turns it off.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        keepalive_interval: float | None = 15.0,
        first_token_timeout: float | None = 300.0,
        idle_timeout: float | None = 120.0,
        max_duration: float | None = 3600.0,
        send_timeout: float | None = 60.0,
        content_types: Sequence[str] = (SSE, NDJSON),
        max_streams: int | None = None,
        registry: StreamRegistry | None = None,
        telemetry: Observer | None = None,
        usage: str = "pass",
        resume: Resume | bool = False,
    ) -> None:
        if usage not in MODES:
            raise ValueError(f"usage must be one of {', '.join(MODES)}, not {usage!r}")
        self.app = app
        self.timeouts = Timeouts(
            keepalive_interval=keepalive_interval,
            first_token_timeout=first_token_timeout,
            idle_timeout=idle_timeout,
            max_duration=max_duration,
            send_timeout=send_timeout,
        )
        self.max_streams = max_streams
        self.registry = registry if registry is not None else StreamRegistry()
        self.telemetry = telemetry  # None: off, nothing per chunk (middleware.telemetry)
        if resume is True:
            from middleware.resume import Resume as MemoryResume

            resume = MemoryResume(keepalive=keepalive_interval)
        # None: off, no edit and nothing per chunk (middleware.resume)
        self.resume: Resume | None = None if isinstance(resume, bool) else resume
        self.settings = GuardSettings(
            app=app,
            timeouts=self.timeouts,
            content_types=frozenset(t.lower().encode() for t in content_types),
            registry=self.registry,
            usage=usage,
            resume=self.resume,
        )
        self.cycle_class = Cycle
        if telemetry is not None:
            self.cycle_class = telemetry.cycle_class
            telemetry.watch(self.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle(scope, receive, send)

    def handle(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """`__call__` without a coroutine of its own: the awaitable that serves this request.
        A server told that its app is ASGI 3 can serve this method (the sidecar's uvicorn
        does): every open stream then holds one coroutine frame less. Call it in the
        request's task, as a server calls its app."""
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        responder: ASGIApp | None = None  # resume: answered from the store, never forwarded
        resume = self.resume
        if resume is not None and (responder := resume.route(scope)) and resume.is_stop(scope):
            return responder(scope, receive, send)  # a stop holds no slot: always admitted
        registry = self.registry
        if registry.draining:
            return self.cycle_class(self.settings, scope, receive, send).refuse(Draining())
        if self.max_streams is not None and len(registry) >= self.max_streams:
            return self.cycle_class(self.settings, scope, receive, send).refuse(TooManyStreams())
        if responder is not None:
            return ResumeReader(registry).run(responder, scope, receive, send)
        return self.cycle_class(self.settings, scope, receive, send).run()


class ResumeReader:
    """One resume reader, in the registry as a stream is: counted toward `max_streams` until
    its answer ends, and ended by a drain with a retryable terminal event.

    A drain cancels the responder; the cancellation lands at an await, and the server writes
    a message only once its send returns (uvicorn waits for the transport before it writes),
    so what was sent is known and the end is written at an event boundary. The terminal
    event carries no `id:`: the reader's last id still names the last event it got, and it
    resumes from there elsewhere.
    """

    __slots__ = ("registry", "sent", "stopping", "task")

    def __init__(self, registry: StreamRegistry) -> None:
        self.registry = registry
        task = asyncio.current_task()
        assert task is not None, "StreamGuard runs inside a task"
        self.task = task
        self.sent = 0  # messages the server took: 1 the head, and the end when not more_body
        self.stopping = False

    async def run(self, responder: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        task = self.task
        base = task.cancelling()

        async def counted(message: Message) -> None:
            await send(message)
            self.sent = 2 if self.sent and not message.get("more_body", False) else 1

        self.registry.add(self)
        try:
            await responder(scope, receive, counted)
        except asyncio.CancelledError:
            if not self.stopping or task.uncancel() > base:
                raise
            await self._end(send)
        finally:
            self.registry.discard(self)

    def shut_down(self) -> None:
        """Drain: end this reader now (StreamRegistry.drain)."""
        if not self.stopping:
            self.stopping = True
            self.task.cancel()

    async def _end(self, send: Send) -> None:
        error = ShuttingDown()
        if self.sent == 0:
            for message in error_response(error.status, error.json_body(), retry_after=1):
                await send(message)
        elif self.sent == 1:
            body = b"data: " + error.json_body() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
