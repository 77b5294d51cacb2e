"""The live view on the admin port: `GET /streams` lists the streams in flight (bounded,
stuck first, with the total), never a header or a body byte; `GET /streams/events` sends
fresh snapshots as SSE; `GET /` is the page. The sidecar's guard and admin app in this
process, in front of the emulator."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware.telemetry import Telemetry
from sidecar import streams_view
from sidecar.app import Sidecar
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import RawResponse, request
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
SECRET_HEADER = "Bearer sk-live-HEADER-SECRET-7f3a"
SECRET_BODY = "BODY-SECRET-prompt-91c2"


def chat(model: str, *, tokens: int, ttft_ms: int, itl_ms: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": f"say {SECRET_BODY}"}],
            "sidestream": {"tokens": tokens, "ttft_ms": ttft_ms, "itl_ms": itl_ms},
        }
    ).encode()


@dataclass
class Ports:
    traffic: int
    admin: int


@pytest.fixture
async def sidecar() -> AsyncIterator[Ports]:
    async with serve(make_app(stats=Stats())) as upstream:
        flags = ["--upstream", f"http://127.0.0.1:{upstream}", "--keepalive-interval", "0.2"]
        app = Sidecar(load(flags, environ={}), Telemetry(metric_readers=[InMemoryMetricReader()]))
        async with serve(app.guard, "sidecar") as traffic, serve(app.admin) as admin:
            yield Ports(traffic, admin)


async def open_stream(port: int, request_id: str, body: bytes) -> RawResponse:
    headers = [
        ("X-Request-ID", request_id),
        ("Authorization", SECRET_HEADER),
        ("Cookie", f"session={SECRET_HEADER}"),
    ]
    response = await request(port, "POST", CHAT, body=body, headers=headers)
    try:
        await response.chunk()  # the role chunk: the stream is under way
    except BaseException:
        response.close()
        raise
    return response


async def streams(admin: int, query: str = "") -> tuple[int, dict[str, Any], str]:
    response = await request(admin, "GET", f"/streams{query}")
    try:
        text = (await response.body()).decode()
    finally:
        response.close()
    return response.status, json.loads(text), text


async def test_streams_lists_each_stream_in_flight_stuck_first(sidecar: Ports) -> None:
    """One entry per stream in flight with its facts; the one with no chunk for longer than
    the keep-alive interval is listed first and marked stuck; finished streams leave."""
    flowing = await open_stream(
        sidecar.traffic, "req-flowing", chat("llama-3-8b", tokens=40, ttft_ms=0, itl_ms=50)
    )
    stalled = await open_stream(
        sidecar.traffic, "req-stalled", chat("qwen2-7b", tokens=2, ttft_ms=1500, itl_ms=10)
    )
    for _ in range(5):
        await flowing.chunk()
    await asyncio.sleep(0.5)  # past the 0.2 s keep-alive interval: the stalled one is stuck
    status, view, _ = await streams(sidecar.admin)
    assert status == 200
    assert view["total"] == 2 and view["limit"] == streams_view.MAX_ENTRIES
    first, second = view["streams"]
    assert first["request_id"] == "req-stalled" and first["stuck"] is True
    assert second["request_id"] == "req-flowing" and second["stuck"] is False
    assert first["since_last_chunk_s"] >= second["since_last_chunk_s"]
    assert set(first) == {
        "request_id", "model", "path", "age_s", "phase", "streaming", "tokens", "ttft_s",
        "since_last_chunk_s", "keepalives", "client",  "stuck",
    }  # fmt: skip
    assert first["model"] == "qwen2-7b" and second["model"] == "llama-3-8b"
    assert first["ttft_s"] is None and first["tokens"] == 0 and first["keepalives"] >= 1
    assert second["ttft_s"] is not None and second["tokens"] >= 5
    assert second["phase"] == "body" and second["path"] == CHAT
    assert first["client"].startswith("127.0.0.1:") and first["age_s"] >= 0.5

    await flowing.body()
    await stalled.body()
    flowing.close()
    stalled.close()
    await asyncio.sleep(0.05)
    _, view, _ = await streams(sidecar.admin)
    assert view == {"total": 0, "limit": streams_view.MAX_ENTRIES, "streams": []}


async def test_no_header_or_body_ever_shows(sidecar: Ports) -> None:
    """A secret in the Authorization and Cookie headers and in the prompt appears in neither
    /streams nor /streams/events."""
    held = await open_stream(
        sidecar.traffic, "req-secret", chat("m", tokens=30, ttft_ms=0, itl_ms=50)
    )
    _, view, text = await streams(sidecar.admin)
    assert view["streams"][0]["request_id"] == "req-secret"
    feed = await request(sidecar.admin, "GET", "/streams/events")
    events = (await feed.chunk() or b"") + (await feed.chunk() or b"")
    feed.close()
    await held.body()
    held.close()
    for shown in (text, events.decode()):
        assert "req-secret" in shown
        for secret in ("HEADER-SECRET", SECRET_BODY, "Bearer", "session="):
            assert secret not in shown


async def test_limit_is_bounded(sidecar: Ports) -> None:
    """`?limit=` lists fewer (the total stays whole), never more than MAX_ENTRIES; a limit
    that is not a number is a 400."""
    held = [
        await open_stream(sidecar.traffic, f"req-{i}", chat("m", tokens=20, ttft_ms=0, itl_ms=50))
        for i in range(3)
    ]
    _, one, _ = await streams(sidecar.admin, "?limit=1")
    _, many, _ = await streams(sidecar.admin, "?limit=100000")
    status, bad, _ = await streams(sidecar.admin, "?limit=lots")
    for response in held:
        await response.body()
        response.close()
    assert one["total"] == 3 and len(one["streams"]) == 1
    assert many["limit"] == streams_view.MAX_ENTRIES and len(many["streams"]) == 3
    assert status == 400 and bad["error"]["code"] == "bad_limit"


async def test_events_feed_sends_fresh_snapshots(sidecar: Ports) -> None:
    """/streams/events is an SSE stream of `streams` events, one per EVENTS_INTERVAL: a
    stream opened after the first snapshot shows in a later one."""
    feed = await request(sidecar.admin, "GET", "/streams/events")
    assert feed.header("content-type") == "text/event-stream; charset=utf-8"
    snapshots: list[dict[str, Any]] = []
    buffer = b""
    held = None

    while len(snapshots) < 3:
        buffer += await asyncio.wait_for(feed.chunk(), 5) or b""
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            lines = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line)
            if lines.get(b"event") == b"streams":
                snapshots.append(json.loads(lines[b"data"]))
                if held is None:
                    held = await open_stream(
                        sidecar.traffic, "req-late", chat("m", tokens=60, ttft_ms=0, itl_ms=50)
                    )
    feed.close()
    assert held is not None
    await held.body()
    held.close()
    assert snapshots[0]["total"] == 0
    assert snapshots[-1]["total"] == 1
    assert snapshots[-1]["streams"][0]["request_id"] == "req-late"


async def test_root_serves_the_self_contained_page(sidecar: Ports) -> None:
    """GET / is the live view's page: HTML with its script inline, nothing from elsewhere."""
    response = await request(sidecar.admin, "GET", "/")
    page = (await response.body()).decode()
    response.close()
    assert response.status == 200
    assert response.header("content-type") == "text/html; charset=utf-8"
    assert "default-src 'none'" in (response.header("content-security-policy") or "")
    assert "http://" not in page and "https://" not in page and "src=" not in page
