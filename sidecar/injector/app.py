"""The injector's ASGI app: `POST /mutate` and `GET /livez`, plus the certificate watcher.

A Starlette app: the webhook is a cold path (one call per pod creation), so routing and
responses are Starlette's. The TLS certificate watcher runs in the lifespan so that it
lives exactly as long as the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

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
        self._app = Starlette(
            routes=[
                Route("/livez", _livez, methods=["GET"]),  # HEAD too
                Route("/mutate", self._mutate, methods=["POST"]),
            ],
            exception_handlers={404: _not_found, 405: _method_not_allowed},
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _mutate(self, request: Request) -> Response:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    return PlainTextResponse("request body too large\n", 413)
                chunks.append(chunk)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to read it: the server drops it
        try:
            body = json.loads(b"".join(chunks))
            if not isinstance(body, dict):
                raise BadReview("expected a JSON object")
            answer = review(body, default_image=self.default_image, on_invalid=self.on_invalid)
        except (ValueError, BadReview) as error:  # json.JSONDecodeError is a ValueError
            return PlainTextResponse(f"{error}\n", 400)
        return JSONResponse(answer)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        watcher: asyncio.Task[None] | None = None
        if self.certificate is not None:
            watcher = asyncio.create_task(self.certificate.watch())
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher


async def _livez(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("not found\n", 404)


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    allow = exc.headers if isinstance(exc, HTTPException) else None
    return PlainTextResponse("method not allowed\n", 405, headers=allow)
