"""StreamGuard on real sockets: uvicorn (httptools and h11) and hypercorn on 127.0.0.1.

Timing, keep-alives, disconnects and backpressure only show over a real connection, so
every test here runs a real server and a raw client that sees each byte as it arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pytest

from middleware.guard import StreamGuard
from middleware.types import Receive, Scope, Send
from tests.support.apps import DONE, NDJSON_HEADERS, ROLE, Probe, chunk, scripted
from tests.support.clients import request
from tests.support.servers import SERVERS, Server, serve
from tests.support.sseparse import comments, parse

POST = {"method": "POST", "path": "/v1/chat/completions", "body": b'{"stream": true}'}


async def fetch(port: int, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
    response = await request(port, **{**POST, **kwargs})
    try:
        body = await response.body()
    finally:
        response.close()
    return response.status, {k.lower(): v for k, v in response.headers}, body


@pytest.mark.parametrize("server", SERVERS)
async def test_headers_reach_the_client_before_the_first_token(server: Server) -> None:
    """Response headers go out at once, not held until the first body byte."""
    app = scripted([(0.5, chunk("late")), (0, DONE)])
    async with serve(StreamGuard(app), server) as port:
        t0 = time.monotonic()
        response = await request(port, **POST)
        headers_at = time.monotonic() - t0
        assert response.status == 200
        assert response.header("x-accel-buffering") == "no"
        body = await response.body()
        response.close()
    assert headers_at < 0.4
    assert parse(body)[0][1] == chunk("late")[6:-2].decode()


STALLS = {
    "event boundary": [ROLE, chunk("a"), b"@", chunk("b"), DONE],
    "between two data lines": [ROLE, b"data: one\n", b"@", b"data: two\n\n", DONE],
    "mid-line": [ROLE, b'data: {"half', b"@", b'-line"}\n\n', DONE],
    "between CR and LF": [ROLE, b"data: crlf\r", b"@", b"\n\r\n", DONE],
    "before the first byte": [b"@", ROLE, chunk("a"), DONE],
}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("where", list(STALLS))
async def test_keepalives_never_change_the_events(server: Server, where: str) -> None:
    """Keep-alive comments fill stalls at line boundaries only; the parsed events are unchanged."""
    pieces = STALLS[where]
    script = []
    pause = 0.0
    for piece in pieces:
        if piece == b"@":
            pause = 0.35
            continue
        script.append((pause, piece))
        pause = 0.0
    expected = parse(b"".join(p for p in pieces if p != b"@"))
    async with serve(StreamGuard(scripted(script), keepalive_interval=0.1), server) as port:
        status, _, body = await fetch(port)
    assert status == 200
    assert parse(body) == expected
    found = comments(body)
    if where in ("mid-line", "between CR and LF"):
        # nothing may go into a half-written line (nor between a CR and its LF): the stall
        # passes with no keep-alive, and the line completes as the app wrote it
        assert found == []
    else:
        assert found and set(found) == {": keep-alive"}


async def test_one_keepalive_per_interval() -> None:
    """A stall gets one comment per keepalive_interval, not a burst and not one per check."""
    interval = 0.1
    app = scripted([(0, ROLE), (0.55, chunk("a")), (0, DONE)])
    async with serve(StreamGuard(app, keepalive_interval=interval)) as port:
        response = await request(port, **POST)
        await response.body()
        response.close()
    stamps = [t for t, data in response.arrivals if data == b": keep-alive\n"]
    assert 3 <= len(stamps) <= 6
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert min(gaps) > interval * 0.8


async def test_ndjson_gets_no_comments_but_timeouts() -> None:
    """NDJSON streams unbuffered with no comment lines, and idle_timeout still applies."""
    script = [(0, b'{"token": "a"}\n'), (0.3, b'{"token": "b"}\n'), (5, b'{"token": "c"}\n')]
    guard = StreamGuard(
        scripted(script, headers=NDJSON_HEADERS), keepalive_interval=0.05, idle_timeout=0.6
    )
    async with serve(guard) as port:
        _, headers, body = await fetch(port)
    lines = body.splitlines()
    assert lines[:2] == [b'{"token": "a"}', b'{"token": "b"}']
    assert json.loads(lines[2])["error"]["code"] == "idle_timeout"
    assert b"keep-alive" not in body and headers["cache-control"] == "no-cache, no-transform"


@pytest.mark.parametrize("server", SERVERS)
async def test_first_token_timeout_ignores_role_chunk(server: Server) -> None:
    """A role-only chunk is not a token: first_token_timeout fires with a terminal event."""
    probe = Probe()
    app = scripted([(0, ROLE), (10, chunk("late"))], probe)
    async with serve(
        StreamGuard(app, first_token_timeout=0.3, keepalive_interval=0.1), server
    ) as port:
        status, _, body = await fetch(port)
    assert status == 200
    events = parse(body)
    assert json.loads(events[-1][1]) == {
        "error": {
            "message": "no token from the upstream within the first-token timeout",
            "type": "timeout",
            "code": "first_token_timeout",
        }
    }
    assert probe.cancelled_at is not None


async def test_a_reasoning_delta_is_the_first_token() -> None:
    """A reasoning model's first delta (`reasoning_content`, no content yet) is its first
    token: the first-token timeout does not fire while it reasons, though its content comes
    later than the timeout. The role chunk and the reasoning delta come in one read, as a
    fast upstream writes them: the first-token check on their bytes hands this one to the
    events."""
    reasoning = ROLE + (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":'
        b'[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}]}\n\n'
    )
    app = scripted([(0, reasoning), (0.6, chunk("a")), (0, DONE)])
    async with serve(StreamGuard(app, first_token_timeout=0.3, keepalive_interval=0.1)) as port:
        status, _, body = await fetch(port)
    assert status == 200 and b"first_token_timeout" not in body
    assert parse(body)[-1][1] == "[DONE]"


async def test_idle_and_max_duration_end_the_stream_cleanly() -> None:
    """idle_timeout and max_duration each end the stream with their own terminal event."""
    idle = scripted([(0, ROLE), (0, chunk("a")), (10, chunk("b"))])
    async with serve(StreamGuard(idle, idle_timeout=0.2)) as port:
        _, _, body = await fetch(port)
    assert json.loads(parse(body)[-1][1])["error"]["code"] == "idle_timeout"

    steady = scripted([(0, ROLE)] + [(0.05, chunk(str(i))) for i in range(100)])
    async with serve(StreamGuard(steady, max_duration=0.4, idle_timeout=1)) as port:
        t0 = time.monotonic()
        _, _, body = await fetch(port)
        took = time.monotonic() - t0
    events = parse(body)
    assert json.loads(events[-1][1])["error"]["code"] == "max_duration"
    assert 3 < len(events) < 20 and took < 2


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("how", ["fin", "rst"])
async def test_client_leaving_cancels_a_silent_app_at_once(server: Server, how: str) -> None:
    """A client that goes away cancels the app within 50 ms, even while the app waits minutes."""
    probe = Probe()
    app = scripted([(0, ROLE), (0, chunk("a")), (300, chunk("never"))], probe)
    async with serve(StreamGuard(app), server) as port:
        response = await request(port, **POST)
        seen = b""
        while b'"a"' not in seen:
            seen += await response.chunk() or b""
        await asyncio.sleep(0.05)
        left = time.monotonic()
        response.reset() if how == "rst" else response.close()
        await probe.wait(5)
    assert probe.cancelled_at is not None
    assert probe.cancelled_at - left < 0.05


async def test_app_listening_for_disconnect_still_hears_it() -> None:
    """An app reading receive() after its body still hears http.disconnect; its body is intact."""
    heard = asyncio.Event()
    body_seen: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body_seen.append(b"".join(parts))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": ROLE, "more_body": True})
        message = await receive()
        if message["type"] == "http.disconnect":
            heard.set()
        await asyncio.sleep(300)

    payload = json.dumps({"messages": ["x" * 100_000]}).encode()
    async with serve(StreamGuard(app)) as port:
        response = await request(port, method="POST", path="/", body=payload)
        await response.chunk()
        response.close()
        await asyncio.wait_for(heard.wait(), 5)
    assert body_seen == [payload]


async def test_slow_client_holds_the_app_in_send() -> None:
    """Backpressure: a client reading a few KB/s holds the app; bytes in flight stay bounded."""
    probe = Probe()
    piece = b"data: " + b"x" * 8186 + b"\n\n"  # 8 KiB events, 20 MiB offered
    app = scripted([(0, piece)] * 2560, probe)
    async with serve(StreamGuard(app, send_timeout=30)) as port:
        response = await request(port, **POST)
        read = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            data = await response.reader.read(4096)
            read += len(data)
            await asyncio.sleep(0.05)  # ~80 KB/s
        in_flight = probe.sent_bytes - read
        response.close()
        await probe.wait(5)
    assert probe.sent_bytes < 20 * 1024 * 1024 // 2  # held long before the 20 MiB offered
    assert in_flight < 8 * 1024 * 1024  # kernel socket buffers plus the server's high-water mark


async def test_client_that_reads_nothing_is_dropped_after_send_timeout() -> None:
    """A client that accepts nothing for send_timeout is dropped and the app is cancelled."""
    probe = Probe()
    piece = b"data: " + b"y" * 65530 + b"\n\n"
    app = scripted([(0, piece)] * 2000, probe)
    async with serve(StreamGuard(app, send_timeout=0.3)) as port:
        response = await request(port, **POST)
        await probe.wait(10)
        response.close()
    assert probe.cancelled_at is not None and not probe.finished


async def test_starlette_streaming_response_is_guarded() -> None:
    """Starlette's StreamingResponse under the guard: keep-alives, events, cancel on disconnect."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    cancelled = asyncio.Event()

    async def tokens() -> Any:
        try:
            yield ROLE
            yield chunk("a")
            await asyncio.sleep(0.3)
            yield chunk("b")
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def endpoint(request: Any) -> StreamingResponse:
        return StreamingResponse(tokens(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])
    async with serve(StreamGuard(app, keepalive_interval=0.1)) as port:
        response = await request(port, **POST)
        seen = b""
        while b'"b"' not in seen:
            seen += await response.chunk() or b""
        response.close()
        await asyncio.wait_for(cancelled.wait(), 2)
    assert b": keep-alive\n" in seen
    assert [e[1] for e in parse(seen)][-1] == chunk("b")[6:-2].decode()


async def test_sse_starlette_event_source_response_is_guarded() -> None:
    """sse-starlette's EventSourceResponse streams through the guard with its events intact."""
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def events() -> Any:
        for i in range(3):
            await asyncio.sleep(0.15)
            yield {"id": str(i), "data": json.dumps({"n": i})}

    async def endpoint(request: Any) -> EventSourceResponse:
        return EventSourceResponse(events(), ping=600)

    app = Starlette(routes=[Route("/stream", endpoint)])
    async with serve(StreamGuard(app, keepalive_interval=0.1)) as port:
        response = await request(port, method="GET", path="/stream")
        body = await response.body()
        response.close()
    assert [(e[1], e[2]) for e in parse(body)] == [
        ('{"n": 0}', "0"),
        ('{"n": 1}', "1"),
        ('{"n": 2}', "2"),
    ]
    assert b": keep-alive\n" in body
