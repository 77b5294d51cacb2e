"""Resume requests at admission (issue 56, items 5 and 6): a resume reader
(`GET /sidestream/v1/streams/<id>?after=n`, or any request with `Last-Event-ID`) holds a
slot of `--max-streams` and is refused while draining, as a stream is; a stop is admitted
always; a resume point that is not ASCII digits is a 400, never a traceback.

The sidecar (`--resume`, memory store) runs on uvicorn (and hypercorn) in front of the
emulator, which counts the generation requests it receives: a resume is never one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware.cycle import Cycle
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import RawResponse, request
from tests.support.servers import Server, serve
from tests.support.sseparse import parse

CHAT = "/v1/chat/completions"
JSON = [("Content-Type", "application/json")]
STREAMS = "/sidestream/v1/streams/"
LISTENERS: list[Server] = ["sidecar", "hypercorn"]


def chat_body(tokens: int, itl_ms: int) -> bytes:
    pacing = {"tokens": tokens, "itl_ms": itl_ms, "ttft_ms": 0}
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps(
        {"model": "m", "stream": True, "messages": messages, "sidestream": pacing}
    ).encode()


# A stream that outlives any test here (1000 tokens, 20 ms apart); each test stops it.
LONG = chat_body(1000, 20)


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


@pytest.fixture
def access_lines(caplog: pytest.LogCaptureFixture) -> Any:
    """The access lines logged so far, parsed."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    return lambda: [
        json.loads(r.getMessage()) for r in caplog.records if r.name == semconv.ACCESS_LOGGER
    ]


@contextlib.contextmanager
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """The records of level ERROR logged by the servers (uvicorn's loggers and hypercorn's do
    not reach root) while the block runs: a traceback or an incomplete response shows here."""
    caught: list[logging.LogRecord] = []

    class Catcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    catcher = Catcher(logging.ERROR)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "hypercorn.error", "sidestream")]
    for logger in loggers:
        logger.addHandler(catcher)
    try:
        yield caught
    finally:
        for logger in loggers:
            logger.removeHandler(catcher)


def sidecar(upstream: int, registry: StreamRegistry, *flags: str) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}", "--resume", *flags], environ={})
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    return build_guard(settings, registry, telemetry)


async def until(check: Any, timeout: float = 5.0) -> None:
    """Wait until `check()` holds (polled every 10 ms), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def events_until(response: RawResponse, count: int) -> bytes:
    """Read until `count` events have arrived; the bytes so far."""
    body = b""
    while len(parse(body)) < count:
        chunk = await response.chunk()
        assert chunk is not None
        body += chunk
    return body


async def produce(port: int, body: bytes = LONG) -> tuple[RawResponse, str]:
    """A chat stream through the sidecar, its first event read; (response, stream id)."""
    response = await request(port, "POST", CHAT, body=body, headers=JSON)
    stream_id = response.header("sidestream-stream-id")
    assert response.status == 200 and stream_id is not None
    await events_until(response, 1)
    return response, stream_id


async def by_url(port: int, stream_id: str, after: str = "0") -> RawResponse:
    return await request(port, "GET", f"{STREAMS}{stream_id}?after={after}")


async def by_header(port: int, last_event_id: str) -> RawResponse:
    """A resume by `Last-Event-ID` on the chat path (`last_event_id` goes out as latin-1)."""
    headers = [*JSON, ("Last-Event-ID", last_event_id)]
    return await request(port, "POST", CHAT, body=chat_body(3, 0), headers=headers)


async def refusal(response: RawResponse) -> tuple[int, str, str | None]:
    """(status, error code, Retry-After) of a JSON error answer; the connection closed."""
    try:
        code = json.loads(await response.body())["error"]["code"]
    finally:
        response.close()
    assert (response.header("content-type") or "").startswith("application/json")
    return response.status, code, response.header("retry-after")


@pytest.mark.parametrize("listener", LISTENERS)
async def test_resume_readers_hold_slots_of_max_streams(
    emulator: tuple[int, Stats], access_lines: Any, listener: Server
) -> None:
    """Rule: with `--max-streams 3`, a producing stream and two resume readers (one by URL,
    one by `Last-Event-ID`) fill the limit; a further reader of either kind gets 503
    `too_many_streams` with Retry-After (outcome `rejected_overload`); a reader that leaves
    frees its slot for the next; a stop is admitted at the limit; nothing is forwarded."""
    upstream, stats = emulator
    registry = StreamRegistry()
    app = sidecar(upstream, registry, "--max-streams", "3")
    async with serve(app, listener) as port:
        producer, stream_id = await produce(port)
        first = await by_url(port, stream_id)
        second = await by_header(port, f"{stream_id}:1")
        open_ = [producer, first, second]
        try:
            assert first.status == 200 and second.status == 200
            await events_until(first, 2)
            await events_until(second, 1)
            assert len(registry) == 3
            over = [
                await refusal(await by_url(port, stream_id)),
                await refusal(await by_header(port, f"{stream_id}:1")),
            ]
            assert over == [(503, "too_many_streams", "1")] * 2
            first.close()
            await until(lambda: len(registry) == 2)
            third = await by_url(port, stream_id, "2")
            open_.append(third)
            assert third.status == 200
            await events_until(third, 1)
            assert len(registry) == 3
            stop = await request(port, "DELETE", f"{STREAMS}{stream_id}")
            stop.close()
            assert stop.status == 204
            for reader in (producer, second, third):
                last = parse(await reader.body())[-1]
                assert json.loads(last[1])["error"]["code"] == "cancelled"
            await until(lambda: len(registry) == 0)
        finally:
            for response in open_:
                response.close()
    assert stats.streams_started == 1
    refused = [line["outcome"] for line in access_lines() if line["status"] == 503]
    assert refused == ["rejected_overload"] * 2


async def test_a_reader_that_finished_frees_its_slot(emulator: tuple[int, Stats]) -> None:
    """Rule: with `--max-streams 1`, resume readers of a finished stream, one after another,
    are each admitted: a reader's slot is freed when its answer ends."""
    upstream, stats = emulator
    registry = StreamRegistry()
    async with serve(sidecar(upstream, registry, "--max-streams", "1"), "sidecar") as port:
        producer = await request(port, "POST", CHAT, body=chat_body(4, 0), headers=JSON)
        whole = parse(await producer.body())
        producer.close()
        stream_id = producer.header("sidestream-stream-id")
        assert stream_id is not None and len(whole) == 7
        await until(lambda: len(registry) == 0)
        for _ in range(5):
            reader = await by_url(port, stream_id)
            replay = parse(await reader.body())
            reader.close()
            assert reader.status == 200 and replay == whole
        assert len(registry) == 0
    assert stats.streams_started == 1


@pytest.mark.parametrize("listener", LISTENERS)
async def test_while_draining_readers_are_refused_and_a_stop_is_not(
    emulator: tuple[int, Stats], access_lines: Any, listener: Server
) -> None:
    """Rule: while draining, a resume reader (by URL or by `Last-Event-ID`) gets the 503 +
    Retry-After an ordinary stream gets (outcome `rejected_draining`); a stop is still
    admitted (204), and it cancels the upstream: a stop frees the drain sooner."""
    upstream, stats = emulator
    registry = StreamRegistry()
    async with serve(sidecar(upstream, registry), listener) as port:
        producer, stream_id = await produce(port)
        try:
            registry.draining = True
            refused = [
                await refusal(await by_url(port, stream_id)),
                await refusal(await by_header(port, f"{stream_id}:1")),
                await refusal(await request(port, "POST", CHAT, body=LONG, headers=JSON)),
            ]
            assert refused == [(503, "shutting_down", "1")] * 3
            stop = await request(port, "DELETE", f"{STREAMS}{stream_id}")
            stop.close()
            assert stop.status == 204
            last = parse(await producer.body())[-1]
            assert json.loads(last[1])["error"]["code"] == "cancelled"
            await until(lambda: stats.streams_cancelled == 1)
        finally:
            producer.close()
    outcomes = [line["outcome"] for line in access_lines() if line["status"] == 503]
    assert outcomes == ["rejected_draining"] * 3


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_drain_ends_an_open_reader_with_a_retryable_event(
    emulator: tuple[int, Stats], listener: Server
) -> None:
    """Rule: a drain ends a resume reader as it ends a stream: one retryable terminal event
    (`shutting_down`, with no `id:` so the reader's last id still names the last event it
    got), then a complete answer; its slot is freed; the server logs no error; the reader
    resumes from its last id."""
    upstream, stats = emulator
    registry = StreamRegistry()
    with server_errors() as errors:
        async with serve(sidecar(upstream, registry), listener) as port:
            producer, stream_id = await produce(port)
            reader = await by_url(port, stream_id)
            try:
                raw = await events_until(reader, 2)
                (held,) = [r for r in registry.requests() if not isinstance(r, Cycle)]
                held.shut_down()  # as StreamRegistry.drain ends what is left in flight
                raw += await reader.body()
                assert len(registry) == 1  # the producing stream goes on
                *stored, end = parse(raw)
                assert json.loads(end[1])["error"]["code"] == "shutting_down"
                assert b"id:" not in raw[raw.rindex(b"\n\ndata: ") :]
                ids = [f"{stream_id}:{n + 1}" for n in range(len(stored))]
                assert [e[2] for e in stored] == ids and end[2] == ids[-1]
                again = await by_header(port, str(stored[-1][2]))
                assert again.status == 200
                (next_event,) = parse(await events_until(again, 1))[:1]
                assert next_event[2] == f"{stream_id}:{len(stored) + 1}"
                again.close()
                stop = await request(port, "DELETE", f"{STREAMS}{stream_id}")
                stop.close()
                await producer.body()
            finally:
                reader.close()
                producer.close()
    assert [r.getMessage() for r in errors] == []
    assert stats.streams_started == 1


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_unicode_digit_resume_point_is_a_400_not_a_traceback(
    emulator: tuple[int, Stats], listener: Server
) -> None:
    """Rule: `after=` and the `<n>` of `Last-Event-ID` are ASCII digits only: a superscript,
    Arabic-Indic or fullwidth digit (percent-encoded UTF-8 in the URL; latin-1 or UTF-8
    bytes in the header), or an empty `after=`, gets 400 `invalid_last_event_id` with a JSON
    body; the server logs no error and nothing is forwarded."""
    upstream, stats = emulator
    registry = StreamRegistry()
    with server_errors() as errors:
        async with serve(sidecar(upstream, registry), listener) as port:
            producer, stream_id = await produce(port, chat_body(4, 0))
            await producer.body()
            producer.close()
            answers = [
                await refusal(await by_url(port, stream_id, after))
                for after in ("%C2%B3", "%D9%A3", "%EF%BC%93", "1%C2%B3", "", "%2B3", "%203")
            ]
            for digit in ("\u00b3", "\u0663", "\uff13"):  # superscript, Arabic-Indic, fullwidth
                wire = digit.encode().decode("latin-1")  # the header's bytes: its UTF-8
                for value in (digit, wire) if digit == "\u00b3" else (wire,):
                    answers.append(await refusal(await by_header(port, f"{stream_id}:{value}")))
            fine = await by_url(port, stream_id, "3")
            replay = parse(await fine.body())
            fine.close()
    assert answers == [(400, "invalid_last_event_id", None)] * 11
    assert fine.status == 200 and len(replay) == 4  # events 4…7
    assert [r.getMessage() for r in errors] == []
    assert stats.streams_started == 1
