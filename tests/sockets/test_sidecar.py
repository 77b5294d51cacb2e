"""The sidecar end to end on real sockets: the guarded proxy in front of the emulator.

The sidecar here is exactly what `python -m sidecar` builds (`build_guard` from parsed
settings) served by uvicorn on 127.0.0.1; the upstream is the built-in emulator, whose
stats say when it saw its client (the sidecar) leave.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from middleware.registry import StreamRegistry
from sidecar.admin import AdminApp, UpstreamHealth
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.servers import bound_socket, serve
from tests.support.sseparse import comments, parse

CHAT = "/v1/chat/completions"


def chat_body(**sidestream: Any) -> bytes:
    body: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    if sidestream:
        body["sidestream"] = sidestream
    return json.dumps(body).encode()


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def sidecar_app(upstream_port: int, *flags: str, registry: StreamRegistry | None = None) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream_port}", *flags], environ={})
    return build_guard(settings, registry or StreamRegistry())


async def stream(port: int, body: bytes) -> tuple[int, dict[str, str], bytes]:
    response = await request(
        port, "POST", CHAT, body=body, headers=[("Content-Type", "application/json")]
    )
    try:
        data = await response.body()
    finally:
        response.close()
    return response.status, {k.lower(): v for k, v in response.headers}, data


async def test_tokens_stream_through_with_usage(emulator: tuple[int, Stats]) -> None:
    """A chat stream arrives event by event, ending with usage and [DONE], headers rewritten."""
    upstream, _ = emulator
    async with serve(sidecar_app(upstream), "sidecar") as port:
        response = await request(port, "POST", CHAT, body=chat_body(tokens=8, itl_ms=30, ttft_ms=0))
        body = await response.body()
        response.close()
    events = [e[1] for e in parse(body)]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 8
    assert response.header("cache-control") == "no-cache, no-transform"
    assert response.header("content-length") is None
    # tokens arrived spread over time, not in one burst at the end
    token_chunks = [
        t for t, data in response.arrivals if b'"content":"' in data and b'"role"' not in data
    ]
    assert token_chunks[-1] - token_chunks[0] > 0.1


async def test_keepalives_during_silent_prefill_and_mid_stream(emulator: tuple[int, Stats]) -> None:
    """Headers go out at once; a long prefill and a slow token both get keep-alive comments."""
    upstream, _ = emulator
    async with serve(sidecar_app(upstream, "--keepalive-interval", "0.1"), "sidecar") as port:
        t0 = time.monotonic()
        response = await request(
            port, "POST", CHAT, body=chat_body(tokens=3, ttft_ms=500, itl_ms=300)
        )
        headers_after = time.monotonic() - t0
        body = await response.body()
        response.close()
    assert headers_after < 0.3
    assert len(comments(body)) >= 4
    assert [e[1] for e in parse(body)][-1] == "[DONE]"


async def test_idle_timeout_through_the_proxy_ends_with_terminal_event(
    emulator: tuple[int, Stats],
) -> None:
    """An upstream gap longer than --idle-timeout ends the stream with an error event; upstream cancelled."""
    upstream, stats = emulator
    async with serve(sidecar_app(upstream, "--idle-timeout", "0.3"), "sidecar") as port:
        status, _, body = await stream(port, chat_body(tokens=3, ttft_ms=0, itl_ms=5000))
        await asyncio.sleep(0.1)
    assert status == 200
    assert json.loads(parse(body)[-1][1])["error"]["code"] == "idle_timeout"
    assert stats.streams_cancelled == 1


async def test_first_token_timeout_before_upstream_headers_is_504() -> None:
    """An upstream that accepts but never answers gets a 504 JSON error at --first-token-timeout."""
    silent_clients: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent_clients.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    upstream = server.sockets[0].getsockname()[1]
    try:
        async with serve(sidecar_app(upstream, "--first-token-timeout", "0.3"), "sidecar") as port:
            t0 = time.monotonic()
            status, headers, body = await stream(port, chat_body())
            took = time.monotonic() - t0
    finally:
        for writer in silent_clients:
            writer.close()
        server.close()
    assert status == 504 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "first_token_timeout"
    assert 0.25 < took < 2


async def test_connection_refused_is_502_json() -> None:
    """No upstream listening: 502 with an OpenAI-style error body naming the cause."""
    sock = bound_socket()
    closed_port = sock.getsockname()[1]
    sock.close()
    async with serve(sidecar_app(closed_port), "sidecar") as port:
        status, _, body = await stream(port, chat_body())
    error = json.loads(body)["error"]
    assert status == 502
    assert error["code"] == "upstream_unreachable" and set(error) == {"message", "type", "code"}


async def test_upstream_dying_mid_stream_ends_with_terminal_event() -> None:
    """An upstream that closes mid-body gives the client an error event and a clean chunked end."""

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()

    server = await asyncio.start_server(dying, "127.0.0.1", 0)
    upstream = server.sockets[0].getsockname()[1]
    try:
        async with serve(sidecar_app(upstream), "sidecar") as port:
            status, _, body = await stream(port, chat_body())  # a truncated chunked end would raise
    finally:
        server.close()
    events = parse(body)
    assert status == 200 and "content" in events[0][1]
    assert json.loads(events[-1][1])["error"]["code"] == "upstream_protocol_error"


@pytest.mark.parametrize("how", ["fin", "rst"])
@pytest.mark.parametrize("phase", ["tokens flowing", "upstream silent"])
async def test_client_leaving_closes_the_upstream_within_50ms_p99(
    emulator: tuple[int, Stats], how: str, phase: str
) -> None:
    """When the client goes away, the upstream sees its connection close within 50 ms (p99 of 25)."""
    upstream, stats = emulator
    itl = 10 if phase == "tokens flowing" else 60_000
    delays = []
    async with serve(sidecar_app(upstream), "sidecar") as port:
        for _ in range(25):
            before = stats.streams_cancelled
            response = await request(
                port, "POST", CHAT, body=chat_body(tokens=1000, ttft_ms=0, itl_ms=itl)
            )
            seen = b""
            while b'"content":"' not in seen.replace(b'"content":""', b""):
                seen += await response.chunk() or b""
            left = time.monotonic()
            response.reset() if how == "rst" else response.close()
            for _ in range(200):
                if stats.streams_cancelled > before:
                    break
                await asyncio.sleep(0.002)
            assert stats.streams_cancelled == before + 1
            delays.append(stats.cancel_times[-1] - left)
    delays.sort()
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    assert p99 < 0.05, (
        f"cancel latency p99 {p99 * 1000:.1f} ms, median {statistics.median(delays) * 1000:.1f} ms"
    )


async def test_max_streams_sheds_with_retry_after_while_admitted_streams_flow(
    emulator: tuple[int, Stats],
) -> None:
    """Past --max-streams new requests get 503 + Retry-After at once; admitted streams complete."""
    upstream, _ = emulator
    async with serve(sidecar_app(upstream, "--max-streams", "2"), "sidecar") as port:
        admitted = [
            asyncio.ensure_future(stream(port, chat_body(tokens=10, ttft_ms=0, itl_ms=30)))
            for _ in range(2)
        ]
        await asyncio.sleep(0.15)
        t0 = time.monotonic()
        status, headers, body = await stream(port, chat_body())
        refused_in = time.monotonic() - t0
        results = await asyncio.gather(*admitted)
    assert status == 503 and headers["retry-after"] == "1"
    assert json.loads(body)["error"]["code"] == "too_many_streams"
    assert refused_in < 0.2
    for admitted_status, _, admitted_body in results:
        assert admitted_status == 200 and parse(admitted_body)[-1][1] == "[DONE]"


async def test_body_and_header_limits(emulator: tuple[int, Stats]) -> None:
    """--max-body gives 413 and oversized headers 431, both as JSON, without reaching the upstream."""
    upstream, stats = emulator
    async with serve(
        sidecar_app(upstream, "--max-body", "1000", "--max-header-bytes", "2000")
    ) as port:
        big, _, big_body = await stream(port, chat_body(text="x" * 2000))
        response = await request(
            port, "POST", CHAT, body=chat_body(), headers=[("X-Big", "y" * 3000)]
        )
        huge_headers = response.status
        await response.body()
        response.close()
    assert big == 413 and json.loads(big_body)["error"]["code"] == "request_too_large"
    assert huge_headers == 431
    assert stats.streams_started == 0


async def test_admin_endpoints(emulator: tuple[int, Stats]) -> None:
    """livez is always 200; readyz follows the upstream's health and turns 503 on drain; metrics count."""
    upstream, _ = emulator
    registry = StreamRegistry()
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
    drains: list[bool] = []
    admin = AdminApp(
        registry, UpstreamHealth(settings.upstream, "/health"), lambda: drains.append(True)
    )
    dead = load(["--upstream", "http://127.0.0.1:9"], environ={})
    dead_admin = AdminApp(registry, UpstreamHealth(dead.upstream, "/health"), lambda: None)
    async with serve(admin) as port, serve(dead_admin) as dead_port:

        async def get(p: int, path: str, method: str = "GET") -> tuple[int, bytes]:
            response = await request(p, method, path)
            body = await response.body()
            response.close()
            return response.status, body

        assert (await get(port, "/livez"))[0] == 200
        assert (await get(port, "/readyz"))[0] == 200
        assert (await get(dead_port, "/readyz"))[0] == 503
        assert (await get(dead_port, "/livez"))[0] == 200
        status, metrics = await get(port, "/metrics")
        assert status == 200 and b"sidestream_active_streams 0" in metrics
        assert (await get(port, "/drain"))[0] == 405
        assert (await get(port, "/drain", "POST"))[0] == 202 and drains == [True]
        registry.draining = True
        status, body = await get(port, "/readyz")
        assert status == 503 and json.loads(body)["status"] == "draining"
        assert (await get(port, "/nope"))[0] == 404


async def test_admin_answers_json_errors_and_prometheus_text() -> None:
    """The admin port's answers keep their shapes: Prometheus' text format for /metrics,
    the JSON error body (never a framework's plain-text default) for an unknown path or a
    wrong method, and no caching of JSON answers."""
    dead = load(["--upstream", "http://127.0.0.1:9"], environ={})
    admin = AdminApp(StreamRegistry(), UpstreamHealth(dead.upstream, "/health"), lambda: None)
    async with serve(admin) as port:
        answers = {}
        for method, path in [("GET", "/metrics"), ("GET", "/nope"), ("GET", "/drain")]:
            response = await request(port, method, path)
            answers[path] = (response.status, response.header, await response.body())
            response.close()
    status, header, body = answers["/metrics"]
    assert status == 200 and header("content-type") == "text/plain; version=0.0.4; charset=utf-8"
    assert b"sidestream_active_streams 0" in body
    for path, status, code in [("/nope", 404, "not_found"), ("/drain", 405, "method_not_allowed")]:
        got, header, body = answers[path]
        assert got == status and header("content-type") == "application/json"
        assert header("cache-control") == "no-store"
        assert json.loads(body)["error"]["code"] == code


async def test_openai_sdk_streams_through_the_sidecar(emulator: tuple[int, Stats]) -> None:
    """The official openai SDK, sync and async, gets the full text and usage through the sidecar."""
    import openai

    upstream, _ = emulator
    async with serve(sidecar_app(upstream, "--keepalive-interval", "0.05"), "sidecar") as port:
        base = f"http://127.0.0.1:{port}/v1"
        extra = {"sidestream": {"tokens": 12, "ttft_ms": 150, "itl_ms": 5}}
        messages: Any = [{"role": "user", "content": "hi"}]

        async_client = openai.AsyncOpenAI(base_url=base, api_key="x")
        text, usage = "", None
        async for part in await async_client.chat.completions.create(
            model="m",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        ):
            if part.choices and part.choices[0].delta.content:
                text += part.choices[0].delta.content
            if part.usage:
                usage = part.usage
        await async_client.close()
        assert usage is not None and usage.completion_tokens == 12 and len(text.split()) >= 10

        def sync_run() -> tuple[str, int]:
            client = openai.OpenAI(base_url=base, api_key="x")
            collected, tokens = "", 0
            for part in client.chat.completions.create(
                model="m",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            ):
                if part.choices and part.choices[0].delta.content:
                    collected += part.choices[0].delta.content
                if part.usage:
                    tokens = part.usage.completion_tokens
            client.close()
            return collected, tokens

        sync_text, sync_tokens = await asyncio.to_thread(sync_run)
    assert sync_text == text and sync_tokens == 12
