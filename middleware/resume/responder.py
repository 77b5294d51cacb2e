"""Resume and stop requests, answered from the store and never forwarded upstream.

- any request with `Last-Event-ID: <id>:<n>`, and `GET /sidestream/v1/streams/<id>?after=<n>`
  (`Last-Event-ID` wins): 200 `text/event-stream`, events n+1…, the live ones, the end. A
  point at or past a finished stream's last event gets 200 and the end at once, no event; one
  past a running stream's last event waits for it (or for the stream's end), on every store;
- `DELETE /sidestream/v1/streams/<id>`: 204, the producing replica cancels the upstream and
  every reader ends with a terminal `cancelled` event.

Errors before the answer starts are JSON in the sidecar's error shape: 400
`invalid_last_event_id`, 404 `stream_not_found` (unknown, expired, or other credentials:
the same answer), 410 `resume_point_gone`, 503 `resume_store_unavailable`. After it has
started, the stream ends with one terminal error event.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any, Protocol

from middleware.resume.ids import InvalidEventId, parse_after, parse_event_id, valid_stream_id
from middleware.resume.producer import Producer
from middleware.resume.store import Reader, ResumeError, Store, StoreUnavailable, StreamNotFound
from middleware.stream_response import error_response
from middleware.types import Receive, Scope, Send

PREFIX = "/sidestream/v1/streams/"
KEEPALIVE = b": keep-alive\n"
STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class Resume(Protocol):
    """What a resume request needs of the hub (`middleware.resume.Resume`)."""

    store: Store
    live: dict[str, Producer]
    keepalive: float | None
    tracer: Any

    async def stop(self, stream_id: str) -> None: ...

    def credentials(self, stream_id: str, headers: list[tuple[bytes, bytes]]) -> str: ...

    def store_failed(self, exc: BaseException) -> None: ...


def last_event_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"last-event-id":
            return str(value.decode("latin-1"))
    return None


def is_stop(scope: Scope) -> bool:
    """A stop (`DELETE` on a stream's URL without `Last-Event-ID`), not a reader."""
    return scope["method"] == "DELETE" and last_event_id(scope) is None


async def json_error(send: Send, status: int, code: str, message: str) -> None:
    kind = "unavailable" if status >= 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "code": code}
    start, body = error_response(
        status, json.dumps({"error": error}, separators=(",", ":")).encode()
    )
    await send(start)
    await send(body)


def target(scope: Scope, header: str | None) -> tuple[str, int]:
    """(stream id, after) of a resume or stop request; InvalidEventId, StreamNotFound."""
    if header is not None:
        return parse_event_id(header)
    stream_id = scope["path"][len(PREFIX) :]
    if not valid_stream_id(stream_id):
        raise StreamNotFound()
    # Blank values kept: `after=` is a point that is not one (400), not "from the start".
    query = urllib.parse.parse_qs(
        scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
    )
    after = parse_after(query["after"][-1]) if "after" in query else 0
    return stream_id, after


async def serve(hub: Resume, scope: Scope, receive: Receive, send: Send) -> None:
    """One resume or stop request (picked by `Resume.route`)."""
    header = last_event_id(scope)
    method = scope["method"]
    if header is None and method not in ("GET", "DELETE"):
        await json_error(send, 405, "method_not_allowed", f"{method} is not allowed here")
        return
    try:
        stream_id, after = target(scope, header)
    except InvalidEventId:
        message = "Last-Event-ID must be <stream-id>:<n> (after=<n>)"
        await json_error(send, 400, "invalid_last_event_id", message)
        return
    except ResumeError as exc:
        await json_error(send, exc.status, exc.code, exc.message)
        return
    store = hub.store
    credentials = hub.credentials(stream_id, scope["headers"])
    try:
        if is_stop(scope):
            await store.check(stream_id, credentials)
            await hub.stop(stream_id)
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        reader = await store.attach(stream_id, after, credentials)
    except ResumeError as exc:
        await json_error(send, exc.status, exc.code, exc.message)
        return
    except Exception as exc:  # the store failed: the same as unavailable
        hub.store_failed(exc)
        error = StoreUnavailable()
        await json_error(send, error.status, error.code, error.message)
        return
    if hub.tracer is None:
        await _replay(hub, stream_id, reader, scope, receive, send)
        return
    span = hub.tracer.start(stream_id, after, reader.link)
    try:
        await _replay(hub, stream_id, reader, scope, receive, send)
    finally:
        span.end()


async def _replay(
    hub: Resume, stream_id: str, reader: Reader, scope: Scope, receive: Receive, send: Send
) -> None:
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.get_running_loop().create_task(_watch(receive, task))
    producer = hub.live.get(stream_id)
    if producer is not None:
        producer.joined()
    headers = [*STREAM_HEADERS, (b"sidestream-stream-id", stream_id.encode())]
    if reader.origin:  # as the first response allowed: a cross-origin EventSource resumes too
        headers.append((b"access-control-allow-origin", reader.origin.encode("latin-1")))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        done = False
        loop = asyncio.get_running_loop()
        keepalive = hub.keepalive
        wrote = loop.time()
        while not done:
            try:
                due = None if keepalive is None else max(0.0, wrote + keepalive - loop.time())
                events, done = await reader.read(due)
            except ResumeError as exc:
                error = {"message": exc.message, "type": "resume_error", "code": exc.code}
                body = b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": body, "more_body": True})
                break
            if events:
                body = b"".join(events)
            elif keepalive is not None and loop.time() >= wrote + keepalive - 0.002:
                body = KEEPALIVE  # at an event boundary: a reader only ever gets whole events
            else:
                continue
            wrote = loop.time()
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not watcher.done() or task.uncancel() > 0:
            raise
    finally:
        watcher.cancel()
        reader.close()
        if producer is not None:
            producer.left()


async def _watch(receive: Receive, task: asyncio.Task[None]) -> None:
    """The reader's disconnect: stop replaying (the request body, if any, is read and
    dropped: a resumed POST is not forwarded)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()
