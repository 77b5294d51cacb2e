"""Real clients through the sidecar in front of the emulator: the openai SDK, httpx-sse, curl -N.

The emulator's `GET /v1/stream` gives every content event an `id:`; with a short
`--keepalive-interval` and a slow token pace the sidecar injects `: keep-alive` comments
between those events. A blank line there would make the openai SDK dispatch an empty event
and fail (openai-python#2722); `test_the_sdk_breaks_on_a_blank_keepalive_after_an_id` shows
that this failure is real, so the tests passing through the sidecar can tell.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse
from openai.types.chat import ChatCompletionChunk

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.servers import serve
from tests.support.sseparse import comments
from tests.support.tools import tool

TOKENS = 8
PACE = {"tokens": TOKENS, "ttft_ms": 150, "itl_ms": 120}


@pytest.fixture
async def sidecar() -> AsyncIterator[int]:
    """The sidecar (keep-alive every 50 ms) in front of the emulator; yields its port."""
    async with serve(make_app(stats=Stats())) as upstream:
        flags = ["--upstream", f"http://127.0.0.1:{upstream}", "--keepalive-interval", "0.05"]
        async with serve(build_guard(load(flags, environ={}), StreamRegistry()), "sidecar") as port:
            yield port


def sdk_get(client: Any, **params: Any) -> Any:
    """`GET /v1/stream` through the SDK's own streaming machinery (its SSE decoder)."""
    stream_cls = openai.AsyncStream if isinstance(client, openai.AsyncOpenAI) else openai.Stream
    return client.get(
        "/stream",
        cast_to=ChatCompletionChunk,
        options={"params": params},
        stream=True,
        stream_cls=stream_cls[ChatCompletionChunk],
    )


async def test_openai_sdk_sync_and_async_with_ids_and_keepalives(sidecar: int) -> None:
    """The openai SDK, sync and async, reads id-carrying events with keep-alives between them."""
    base = f"http://127.0.0.1:{sidecar}/v1"
    async with httpx.AsyncClient(timeout=10) as http:
        raw = (await http.get(f"{base}/stream", params=PACE)).content
    assert b"\nid: 3\n" in raw and len(comments(raw)) >= 4  # the hazard is really there

    client = openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0)
    texts = []
    async for chunk in await sdk_get(client, **PACE):
        texts.extend(c.delta.content or "" for c in chunk.choices)
    await client.close()

    def sync_run() -> list[str]:
        with openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0) as sync_client:
            return [c.delta.content or "" for k in sdk_get(sync_client, **PACE) for c in k.choices]

    sync_texts = await asyncio.to_thread(sync_run)
    assert len([t for t in texts if t]) == TOKENS
    assert sync_texts == texts


async def test_the_sdk_breaks_on_a_blank_keepalive_after_an_id() -> None:
    """Control: a blank-line keep-alive after an `id:` event breaks the SDK (so the test above can fail)."""

    async def blank_keepalive(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        event = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        event["choices"] = [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]
        body = b"id: 1\ndata: " + json.dumps(event).encode() + b"\n\n\n"  # blank keep-alive
        await send({"type": "http.response.body", "body": body + b"data: [DONE]\n\n"})

    async with serve(blank_keepalive) as port:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        with pytest.raises(ValueError):  # json.JSONDecodeError on the empty event
            async for _ in await sdk_get(client):
                pass
        await client.close()


async def test_httpx_sse_sees_ids_and_no_keepalive_events(sidecar: int) -> None:
    """httpx + httpx-sse: events arrive one by one with ids 0..n; keep-alives dispatch nothing."""
    url = f"http://127.0.0.1:{sidecar}/v1/stream"
    arrivals: list[tuple[float, str, str]] = []
    async with (
        httpx.AsyncClient(timeout=10) as client,
        aconnect_sse(client, "GET", url, params=PACE) as source,
    ):
        assert source.response.headers["x-accel-buffering"] == "no"
        async for event in source.aiter_sse():
            arrivals.append((time.monotonic(), event.id, event.data))
    data = [d for _, _, d in arrivals]
    assert "" not in data and data[-1] == "[DONE]"
    ids = [i for _, i, _ in arrivals if i]
    assert ids[:TOKENS] == [str(i) for i in range(TOKENS)]  # the role event carries none
    times = [t for t, i, _ in arrivals if i]
    assert times[TOKENS - 1] - times[0] > (TOKENS - 2) * 0.1  # spread, not one burst


async def test_curl_no_buffer_prints_tokens_as_they_come(sidecar: int) -> None:
    """`curl -N` through the sidecar prints each event when it arrives, keep-alives included."""
    curl = tool("curl")
    url = f"http://127.0.0.1:{sidecar}/v1/stream?{urlencode(PACE)}"
    process = await asyncio.create_subprocess_exec(
        curl, "-sS", "-N", url, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    lines: list[tuple[float, bytes]] = []
    while line := await asyncio.wait_for(process.stdout.readline(), 10):
        lines.append((time.monotonic(), line))
    assert await process.wait() == 0
    tokens = [t for t, line in lines if line.startswith(b"data: {") and b'"content"' in line]
    assert len(tokens) >= TOKENS
    assert tokens[TOKENS - 1] - tokens[1] > (TOKENS - 3) * 0.1
    assert any(line == b": keep-alive\n" for _, line in lines)
