"""Resumable streams in one process: the sidecar (`--resume`, memory store) on uvicorn in front
of the emulator, read by the openai SDK and a raw client; the emulator counts the generation
requests it receives (`Stats.streams_started`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.servers import serve
from tests.support.sseparse import parse

CHAT = "/v1/chat/completions"
MESSAGES: Any = [{"role": "user", "content": "hi"}]
JSON = [("Content-Type", "application/json")]


def chat_body(**sidestream: Any) -> bytes:
    return json.dumps(
        {"model": "m", "stream": True, "messages": MESSAGES, "sidestream": sidestream}
    ).encode()


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def sidecar(upstream: int, *flags: str, telemetry: Any = None) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}", "--resume", *flags], environ={})
    return build_guard(settings, StreamRegistry(), telemetry)


async def until(check: Any, timeout: float = 5.0) -> None:
    """Wait until `check()` holds (polled every 10 ms), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def text_of(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_openai_sdk_resumes_where_it_was_cut(emulator: tuple[int, Stats]) -> None:
    """Rule: a stream cut after k events and resumed with `Last-Event-ID: <id>:<k>` gives the
    k events plus the rest: the same text as an uninterrupted run, from one upstream request."""
    upstream, stats = emulator
    pacing = {"sidestream": {"tokens": 24, "itl_ms": 15, "ttft_ms": 0}}
    async with (
        serve(sidecar(upstream), "sidecar") as port,
        AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as client,
    ):
        whole = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, extra_body=pacing
            )
        ]
        started = stats.streams_started
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True, extra_body=pacing
        )
        stream_id = raw.headers["sidestream-stream-id"]
        assert len(stream_id) >= 22
        stream = raw.parse()
        first: list[Any] = []
        async for chunk in stream:
            first.append(chunk)
            if len(first) == 5:
                break
        await stream.response.aclose()  # the socket is closed mid-stream
        rest = [
            c
            async for c in await client.chat.completions.create(
                model="m",
                messages=MESSAGES,
                stream=True,
                extra_body=pacing,
                extra_headers={"Last-Event-ID": f"{stream_id}:{len(first)}"},
            )
        ]
    assert text_of(first) + text_of(rest) == text_of(whole) != ""
    assert len(first) + len(rest) == len(whole)
    assert stats.streams_started == started + 1


async def test_each_event_is_stamped_and_the_header_names_the_stream(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: every event carries `id: <stream-id>:<n>`, n counting events from 1; a resume by
    `GET /sidestream/v1/streams/<id>?after=n` replays n+1… byte for byte, not forwarded."""
    upstream, stats = emulator
    async with serve(sidecar(upstream), "sidecar") as port:
        response = await request(
            port, "POST", CHAT, body=chat_body(tokens=6, itl_ms=0), headers=JSON
        )
        body = await response.body()
        response.close()
        stream_id = response.header("sidestream-stream-id")
        assert stream_id is not None
        events = parse(body)
        assert [e[2] for e in events] == [f"{stream_id}:{n}" for n in range(1, len(events) + 1)]
        started = stats.streams_started
        again = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=3")
        replay = await again.body()
        again.close()
    assert again.status == 200 and (again.header("content-type") or "").startswith(
        "text/event-stream"
    )
    assert body.endswith(replay) and parse(replay) == events[3:]
    assert stats.streams_started == started


async def open_stream(port: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> Any:
    """A chat stream through the sidecar, its head read; returns (response, stream id)."""
    response = await request(port, "POST", CHAT, body=body, headers=[*JSON, *(headers or [])])
    stream_id = response.header("sidestream-stream-id")
    try:
        assert response.status == 200 and stream_id is not None
    except BaseException:
        response.close()
        raise
    return response, stream_id


async def events_until(response: Any, count: int) -> bytes:
    """Read until `count` events have arrived; the bytes so far."""
    body = b""
    while len(parse(body)) < count:
        chunk = await response.chunk()
        assert chunk is not None
        body += chunk
    return body


async def test_nobody_resumes_so_the_upstream_is_cancelled_after_the_grace(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: a reader's disconnect does not cancel at once; generation goes on for
    `--resume-grace` after the last reader left, then the upstream sees the cancel (within
    grace + 1 s), and a late resume gets the stored events and a terminal error."""
    upstream, stats = emulator
    async with serve(sidecar(upstream, "--resume-grace", "0.6"), "sidecar") as port:
        response, stream_id = await open_stream(port, chat_body(tokens=500, itl_ms=20))
        await events_until(response, 3)
        left = time.monotonic()
        response.close()
        await until(lambda: stats.streams_cancelled == 1, timeout=3.0)
        cancelled = stats.cancel_times[-1] - left
        assert 0.5 < cancelled < 0.6 + 1.0
        late = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=0")
        replay = parse(await late.body())
        late.close()
    assert len(replay) > 10
    assert json.loads(replay[-1][1])["error"]["code"] == "resume_grace_expired"


async def test_delete_stops_generation_and_every_reader_gets_cancelled(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: `DELETE /sidestream/v1/streams/<id>` answers 204, cancels the upstream at once,
    and ends the original reader and a resumed reader each with a terminal `cancelled`."""
    upstream, stats = emulator
    async with serve(sidecar(upstream), "sidecar") as port:
        first, stream_id = await open_stream(port, chat_body(tokens=500, itl_ms=20))
        await events_until(first, 3)
        second = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=1")
        await events_until(second, 2)
        stop = await request(port, "DELETE", f"/sidestream/v1/streams/{stream_id}")
        assert stop.status == 204
        stop.close()
        asked = time.monotonic()
        bodies = [await first.body(), await second.body()]
        first.close()
        second.close()
        await until(lambda: stats.streams_cancelled == 1)
        assert stats.cancel_times[-1] - asked < 0.5
    for body in bodies:
        last = parse(body)[-1]
        assert json.loads(last[1])["error"]["code"] == "cancelled"
        assert last[2].startswith(stream_id + ":")


async def test_bad_resume_requests_get_their_status_and_are_never_forwarded(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: unknown id → 404 stream_not_found; malformed Last-Event-ID → 400
    invalid_last_event_id; another tenant's credentials → the same 404; a resume point
    trimmed away (`--resume-max-bytes`) → 410 resume_point_gone; none reaches the upstream."""
    upstream, stats = emulator
    flags = ("--resume-max-bytes", "2000")
    async with serve(sidecar(upstream, *flags), "sidecar") as port:
        owner = [("Authorization", "Bearer tenant-a")]
        response, stream_id = await open_stream(port, chat_body(tokens=60, itl_ms=0), owner)
        await response.body()
        response.close()
        started = stats.streams_started

        async def status(headers: list[tuple[str, str]], path: str = CHAT) -> tuple[int, str]:
            method = "POST" if path == CHAT else "GET"
            answer = await request(
                port, method, path, body=chat_body() if path == CHAT else b"", headers=headers
            )
            data = json.loads(await answer.body())
            answer.close()
            return answer.status, data["error"]["code"]

        unknown = "B" * 22
        assert await status([*JSON, ("Last-Event-ID", f"{unknown}:3")]) == (404, "stream_not_found")
        assert await status([], f"/sidestream/v1/streams/{unknown}") == (404, "stream_not_found")
        for bad in ("3", f"{stream_id}", f"{stream_id}:x", "a:1"):
            assert await status([*JSON, ("Last-Event-ID", bad)]) == (400, "invalid_last_event_id")
        other = [*JSON, ("Authorization", "Bearer tenant-b"), ("Last-Event-ID", f"{stream_id}:1")]
        assert await status(other) == (404, "stream_not_found")
        assert await status([*JSON, ("Last-Event-ID", f"{stream_id}:1")]) == (
            404,
            "stream_not_found",
        )
        trimmed = [*owner, ("Last-Event-ID", f"{stream_id}:1")]
        assert await status(trimmed, f"/sidestream/v1/streams/{stream_id}") == (
            410,
            "resume_point_gone",
        )
        fine = await request(
            port, "GET", f"/sidestream/v1/streams/{stream_id}?after=58", headers=owner
        )
        assert fine.status == 200 and parse(await fine.body())[-1][1] == "[DONE]"
        fine.close()
    assert stats.streams_started == started


async def test_an_expired_stream_is_not_found(emulator: tuple[int, Stats]) -> None:
    """Rule: a finished stream stays resumable for `--resume-ttl` seconds, then a resume gets
    404 stream_not_found and is not forwarded."""
    upstream, stats = emulator
    async with serve(sidecar(upstream, "--resume-ttl", "0.3"), "sidecar") as port:
        response, stream_id = await open_stream(port, chat_body(tokens=3, itl_ms=0))
        await response.body()
        response.close()
        started = stats.streams_started
        statuses = []
        deadline = time.monotonic() + 5
        while not statuses or statuses[-1] == 200:
            assert time.monotonic() < deadline, "the stream never expired"
            again = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=4")
            body = await again.body()
            again.close()
            statuses.append(again.status)
            await asyncio.sleep(0.05)
    assert statuses[0] == 200 and statuses[-1] == 404
    assert json.loads(body)["error"]["code"] == "stream_not_found"
    assert stats.streams_started == started


async def test_one_span_per_stream_resumes_linked_and_counted_in_the_access_line(
    emulator: tuple[int, Stats], caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: the generating stream keeps one span and one access line, which name the stream,
    count the resume requests served and say whether a reader read its end; each resume
    request gets its own short span, linked to the generating stream's."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    upstream, _ = emulator
    exporter = InMemorySpanExporter()
    app = sidecar(upstream, telemetry=Telemetry(span_processor=SimpleSpanProcessor(exporter)))
    async with serve(app, "sidecar") as port:
        response, stream_id = await open_stream(port, chat_body(tokens=30, itl_ms=30))
        await events_until(response, 3)
        response.close()
        first = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=3")
        await events_until(first, 2)
        first.close()
        second = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=3")
        assert parse(await second.body())[-1][1] == "[DONE]"
        second.close()

        def lines() -> list[dict[str, Any]]:
            return [
                json.loads(r.getMessage())
                for r in caplog.records
                if r.name == semconv.ACCESS_LOGGER
            ]

        await until(lambda: len(lines()) >= 1 and len(exporter.get_finished_spans()) >= 3)
    (line,) = lines()
    assert line["stream_id"] == stream_id and line["outcome"] == "completed"
    assert line["resumes"] == 2 and line["end_seen"] is True
    spans = exporter.get_finished_spans()
    (stream,) = [s for s in spans if s.name != "sidestream.resume"]
    resumes = [s for s in spans if s.name == "sidestream.resume"]
    assert len(spans) == 3 and len(resumes) == 2
    assert stream.attributes is not None and stream.attributes["sidestream.resume.count"] == 2
    for span in resumes:
        assert [link.context.span_id for link in span.links] == [stream.context.span_id]
        assert span.attributes is not None
        assert span.attributes["sidestream.resume.stream_id"] == stream_id


async def test_a_resume_allows_the_origin_the_first_response_allowed(
    emulator: tuple[int, Stats],
) -> None:
    """Rule: a resumed answer carries the first response's Access-Control-Allow-Origin, so a
    cross-origin EventSource can resume; a stream without one gets none."""
    upstream, _ = emulator
    async with serve(sidecar(upstream), "sidecar") as port:
        first = await request(port, "GET", "/v1/stream?tokens=3&ttft_ms=0&itl_ms=0")
        await first.body()
        first.close()
        stream_id = first.header("sidestream-stream-id")
        again = await request(
            port, "GET", "/v1/stream", headers=[("Last-Event-ID", f"{stream_id}:2")]
        )
        replay = parse(await again.body())
        again.close()
        chat, chat_id = await open_stream(port, chat_body(tokens=2, itl_ms=0))
        await chat.body()
        chat.close()
        plain = await request(port, "GET", f"/sidestream/v1/streams/{chat_id}")
        await plain.body()
        plain.close()
    assert first.header("access-control-allow-origin") == "*"
    assert again.header("access-control-allow-origin") == "*" and replay[-1][1] == "[DONE]"
    assert plain.status == 200 and plain.header("access-control-allow-origin") is None
