"""The injector's ASGI app: `POST /mutate` and `GET /livez`, plus the certificate watcher.

Pure ASGI, no framework: two routes do not need one. The TLS certificate watcher runs
as a lifespan task so that it lives exactly as long as the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from middleware.types import Receive, Scope, Send
from sidecar.injector.review import BadReview, InvalidPolicy, review
from sidecar.injector.settings import DEFAULT_IMAGE
from sidecar.injector.tls import ReloadingCertificate

MAX_BODY = 4 * 1024 * 1024  # the API server sends at most ~3 MiB objects

__all__ = ["InjectorApp", "InvalidPolicy"]


class InjectorApp:
    def __init__(
        self,
        *,
        default_image: str = DEFAULT_IMAGE,
        on_invalid: InvalidPolicy = "admit",
        certificate: ReloadingCertificate | None = None,
    ) -> None:
        self.default_image = default_image
        self.on_invalid: InvalidPolicy = on_invalid
        self.certificate = certificate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/livez" and method in ("GET", "HEAD"):
            await _respond(send, 200, b"ok\n", "text/plain")
        elif path == "/mutate" and method == "POST":
            await self._mutate(receive, send)
        elif path in ("/livez", "/mutate"):
            await _respond(send, 405, b"method not allowed\n", "text/plain")
        else:
            await _respond(send, 404, b"not found\n", "text/plain")

    async def _mutate(self, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                await _respond(send, 413, b"request body too large\n", "text/plain")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            body = json.loads(b"".join(chunks))
            if not isinstance(body, dict):
                raise BadReview("expected a JSON object")
            answer = review(body, default_image=self.default_image, on_invalid=self.on_invalid)
        except (ValueError, BadReview) as error:  # json.JSONDecodeError is a ValueError
            await _respond(send, 400, f"{error}\n".encode(), "text/plain")
            return
        await _respond(send, 200, json.dumps(answer).encode(), "application/json")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        watcher: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.certificate is not None:
                    watcher = asyncio.create_task(self.certificate.watch())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if watcher is not None:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
