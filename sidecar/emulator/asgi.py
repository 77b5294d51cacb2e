"""Small raw-ASGI helpers for the emulator: headers, body, JSON responses, the disconnect watch."""

from __future__ import annotations

import asyncio
import json

from middleware.types import Message, Receive, Scope, Send
from sidecar.emulator.plan import BadRequest, Headers

JSON = b"application/json"
CORS = (b"access-control-allow-origin", b"*")


class ClientGone(Exception):
    """The client left before the request body was read."""


class Watch:
    """Cancels the current task when the client disconnects, until `stop()`."""

    __slots__ = ("_stopped", "_task", "_watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._stopped = False
        self.gone = False
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._stopped:
            self.gone = True
            self._task.cancel()

    def stop(self) -> None:
        self._stopped = True
        self._watcher.cancel()

    def absorb(self) -> bool:
        """In `except CancelledError`: True when it was the client leaving (then swallow it)."""
        return self.gone and self._task.uncancel() == 0


def read_headers(scope: Scope) -> tuple[Headers, int | None]:
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name.startswith(b"x-emulator-") or name in (b"last-event-id", b"content-length"):
            found[name] = value.decode("latin-1")
    length = None
    if b"content-length" in found:
        try:
            length = int(found[b"content-length"])
        except ValueError:
            raise BadRequest("Invalid Content-Length.") from None
    headers = Headers(
        ttft_ms=found.get(b"x-emulator-ttft-ms"),
        itl_ms=found.get(b"x-emulator-itl-ms"),
        tokens=found.get(b"x-emulator-tokens"),
        stamp=found.get(b"x-emulator-stamp"),
        last_event_id=found.get(b"last-event-id"),
    )
    return headers, length


async def read_body(receive: Receive, limit: int, length: int | None) -> bytes:
    if length is not None and length > limit:
        raise BadRequest(f"Request body over {limit} bytes.", status=413, code="request_too_large")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BadRequest(
                f"Request body over {limit} bytes.", status=413, code="request_too_large"
            )
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if status == 204:
        headers = []
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def error(
    send: Send,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    extra = list(extra or [])
    if status == 413:
        extra.append((b"connection", b"close"))  # the rest of the body is never read
    await respond(send, status, json.dumps({"error": error}).encode(), extra=extra)


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
