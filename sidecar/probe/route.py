"""The sidecar's probe route: `/sidestream/v1/probe` is answered here, never proxied.

With `--probe off` the path still stops here, with 404: it is sidestream's, and an upstream
that happened to serve it must not be mistaken for the probe.
"""

from __future__ import annotations

from collections.abc import Awaitable

from middleware.probe import PROBE_PATH, ProbeApp, refuse
from middleware.types import ASGIApp, Receive, Scope, Send


class ProbeRoute:
    """Send the probe path to `probe` (or 404 when None), everything else to `app`."""

    def __init__(self, app: ASGIApp, probe: ProbeApp | None) -> None:
        self.app = app
        self.probe = probe

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Returns the chosen app's awaitable rather than awaiting it in a coroutine of its
        # own: one frame less held by every open stream.
        if scope["type"] != "http" or scope["path"].rstrip("/") != PROBE_PATH:
            return self.app(scope, receive, send)
        if self.probe is None:
            return refuse(send, 404, "probe_off", "the probe is turned off (--probe off)")
        return self.probe(scope, receive, send)
