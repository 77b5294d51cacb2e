"""One request after another on a connection (`Turns`): each request's app run as a task of
the server's, the next pipelined request started when a response completes, the keep-alive
timer between requests, and the server's `shutdown()`.
"""

from __future__ import annotations

import asyncio
import contextvars

from middleware.types import ASGIApp
from sidecar.servers.http1.cycle import RequestCycle
from sidecar.servers.http1.events import Flow
from sidecar.servers.uvicorn_internals import Served


class Turns:
    """The protocol's requests in turn, as uvicorn's own protocol takes them."""

    # Its field is a slot of the protocol's: a second base with slots of its own would
    # conflict with the limits' (`body.BodyLimits`) in the protocol's layout.
    __slots__ = ()

    served: Served
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: Flow
    cycle: RequestCycle | None
    pipeline: list[tuple[RequestCycle, ASGIApp]] | None  # requests read, waiting their turn
    _keep_alive: asyncio.TimerHandle | None  # set between requests

    def _run(self, cycle: RequestCycle, app: ASGIApp) -> None:
        """The request's app, as a task of the server's (`Server.shutdown` waits for them)."""
        served = self.served
        # One context for the task and its done callback (left to itself, the callback would
        # take a copy of its own, which the task holds while it runs). uvicorn's opt-in
        # `reset_contextvars`: no context from the lifespan.
        fresh = served.reset_contextvars
        context = contextvars.Context() if fresh else contextvars.copy_context()
        task = self.loop.create_task(cycle.run_asgi(app), context=context)
        task.add_done_callback(served.forget, context=context)
        served.tasks.add(task)

    def on_response_complete(self) -> None:
        self.served.state.total_requests += 1
        if self.transport.is_closing():
            return
        self._stop_keep_alive()
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.pipeline:  # the next pipelined request starts
            cycle, app = self.pipeline.pop(0)
            self._run(cycle, app)
        else:
            self._keep_alive = self.loop.call_later(  # type: ignore[misc]  # see __slots__
                self.served.timeout_keep_alive, self._keep_alive_ended
            )

    def _stop_keep_alive(self) -> None:
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None  # type: ignore[misc]

    def _keep_alive_ended(self) -> None:
        """No request came within the keep-alive timeout of the last response."""
        if not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: an idle connection closes, a busy one after its response."""
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:
            self.cycle.keep_alive = False
