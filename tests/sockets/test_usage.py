"""Usage you can bill on, through the real stack (the sidecar's listener, StreamGuard, the
proxy, the emulator): forced usage is invisible to a client that did not ask, untouched for
one that did, and every stream — an early end included — ends with usage in its span and
access line, reported by the server or counted from the chunks relayed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from middleware.types import Message, Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.faulty import FaultyUpstream
from tests.support.servers import serve

CHAT = "/v1/chat/completions"


class Recording:
    """The emulator, keeping each request body it was sent (what the upstream saw)."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.app = make_app(stats=self.stats)
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []  # every request body as it arrived
        self.port = 0  # where it listens (for a direct request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []

        async def tapped() -> Message:
            message = await receive()
            parts.append(message.get("body", b""))
            if message["type"] == "http.request" and not message.get("more_body", False):
                self.raw.append(b"".join(parts))
                with contextlib.suppress(ValueError, RecursionError):
                    self.bodies.append(json.loads(self.raw[-1]))
            return message

        await self.app(scope, tapped, send)


@contextlib.asynccontextmanager
async def stack(
    *flags: str,
) -> AsyncIterator[tuple[int, Recording, InMemorySpanExporter, Any, Telemetry]]:
    spans = InMemorySpanExporter()
    telemetry = Telemetry(
        span_processor=SimpleSpanProcessor(spans), metric_readers=[InMemoryMetricReader()]
    )
    upstream = Recording()
    async with serve(upstream) as up:
        upstream.port = up
        settings = load(["--upstream", f"http://127.0.0.1:{up}", *flags], environ={})
        registry = StreamRegistry()
        async with serve(build_guard(settings, registry, telemetry), "sidecar") as port:
            yield port, upstream, spans, registry, telemetry


def chat(tokens: int = 6, usage: bool | None = None, **pacing: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "sidestream": {"tokens": tokens, "itl_ms": 5, **pacing},
    }
    if usage is not None:
        body["stream_options"] = {"include_usage": usage}
    return body


async def raw(port: int, body: dict[str, Any]) -> bytes:
    response = await request(port, "POST", CHAT, body=json.dumps(body).encode())
    try:
        text = await asyncio.wait_for(response.body(), 10)
    finally:
        response.close()
    return text


def same_shape(text: bytes) -> bytes:
    """A stream's bytes with the emulator's per-request id and timestamp made equal."""
    text = re.sub(rb'"id":"chatcmpl-[0-9a-f]+"', b'"id":"x"', text)
    return re.sub(rb'"created":\d+', b'"created":0', text)


def span_of(spans: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in spans.get_finished_spans() if s.attributes]
    return span


async def test_forced_usage_is_invisible_to_a_client_that_did_not_ask(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without `include_usage` the client reads exactly the bytes of a `--usage pass` run; the
    upstream was asked for usage, and the span and access line carry the server's counts."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    async with stack("--usage", "pass") as (port, upstream, _, _, _):
        passed = await raw(port, chat())
        assert "stream_options" not in upstream.bodies[-1]
    async with stack() as (port, upstream, spans, _, telemetry):
        forced = await raw(port, chat())
        assert upstream.bodies[-1]["stream_options"] == {"include_usage": True}
        await asyncio.sleep(0)
        span = span_of(spans)
    assert same_shape(forced) == same_shape(passed)
    assert b'"usage"' not in forced
    assert span.attributes is not None
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert span.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] > 0
    assert span.attributes[semconv.USAGE_SOURCE] == "reported"
    line = json.loads([r for r in caplog.records if r.name == semconv.ACCESS_LOGGER][-1].message)
    assert line["output_tokens"] == 6 and line["usage_source"] == "reported"
    (usage,) = [m for m in telemetry.metrics() if m.name == semconv.METRIC_TOKEN_USAGE]
    by_type = {
        dict(p.attributes or {})[semconv.GEN_AI_TOKEN_TYPE]: p.sum
        for p in usage.data.data_points  # type: ignore[union-attr]
    }
    assert by_type["output"] == 6 and by_type["input"] == line["input_tokens"] > 0


async def test_the_openai_sdk_that_asked_for_usage_gets_it_untouched() -> None:
    """A client that asked sees the usage chunk (the official SDK parses it), and the
    request reached the upstream as the client wrote it."""
    async with stack() as (port, upstream, _, _, _):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        )
        body = chat()
        stream = await client.chat.completions.create(
            model="m",
            messages=body["messages"],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"sidestream": body["sidestream"]},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        assert upstream.bodies[-1]["stream_options"] == {"include_usage": True}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) == 6


async def test_the_openai_sdk_without_usage_never_sees_a_usage_chunk() -> None:
    """The official SDK, not asking: every chunk has choices, none has usage."""
    async with stack() as (port, _, spans, _, _):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        )
        body = chat()
        stream = await client.chat.completions.create(
            model="m",
            messages=body["messages"],
            stream=True,
            extra_body={"sidestream": body["sidestream"]},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        await asyncio.sleep(0)
        span = span_of(spans)
    assert all(c.usage is None and c.choices for c in chunks)
    assert span.attributes is not None
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 6


@pytest.mark.parametrize("end", ["client_close", "idle_timeout", "drain"])
async def test_an_early_end_has_counted_usage_and_finish_reason_error(end: str) -> None:
    """A stream that does not reach its own end has output tokens equal to the content
    chunks relayed, marked `counted`, and `finish_reasons` `["error"]`."""
    flags = ["--idle-timeout", "0.3"] if end == "idle_timeout" else []
    async with stack(*flags) as (port, _, spans, registry, _):
        # Fast tokens for a client that leaves after three; for the others a gap after each
        # token longer than the idle timeout, or slow enough for the drain to cut in.
        pacing = {"itl_ms": 5} if end == "client_close" else {"itl_ms": 2000}
        body = json.dumps(chat(tokens=50, **pacing)).encode()
        response = await request(port, "POST", CHAT, body=body)
        events, wanted = 0, 4 if end == "client_close" else 2  # the role chunk, then tokens
        while events < wanted:
            chunk = await asyncio.wait_for(response.chunk(), 5)
            assert chunk is not None, "the stream ended early"
            events += chunk.count(b"data: ")
        if end == "client_close":
            response.close()
        elif end == "drain":
            registry.shut_down_all()
            await asyncio.wait_for(response.body(), 5)
            response.close()
        else:
            await asyncio.wait_for(response.body(), 5)
            response.close()
        async with asyncio.timeout(5):
            while not [s for s in spans.get_finished_spans() if s.attributes]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        span = span_of(spans)
    attributes = span.attributes
    assert attributes is not None
    relayed = attributes[semconv.TOKENS]
    assert isinstance(relayed, int) and relayed >= wanted - 1
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == relayed
    assert attributes[semconv.USAGE_SOURCE] == "counted"
    assert tuple(attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ("error",)


async def test_continuous_usage_gives_an_early_end_the_servers_own_count() -> None:
    """With `--usage continuous` a stream cut mid-way carries the server's last count
    (`reported`), and the client — which did not ask — sees no `usage` field at all."""
    async with stack("--usage", "continuous") as (port, upstream, spans, _, _):
        body = json.dumps(chat(tokens=50, itl_ms=5)).encode()
        response = await request(port, "POST", CHAT, body=body)
        seen = b""
        while seen.count(b"data: ") < 6:  # the role chunk, then 5 content chunks
            chunk = await asyncio.wait_for(response.chunk(), 5)
            assert chunk is not None, "the stream ended early"
            seen += chunk
        response.close()
        assert upstream.bodies[-1]["stream_options"] == {
            "include_usage": True,
            "continuous_usage_stats": True,
        }
        async with asyncio.timeout(5):
            while not [s for s in spans.get_finished_spans() if s.attributes]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        span = span_of(spans)
    assert b'"usage"' not in seen
    attributes = span.attributes
    assert attributes is not None
    assert attributes[semconv.USAGE_SOURCE] == "reported"
    reported = attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert isinstance(reported, int) and reported >= 5
    assert reported == attributes[semconv.TOKENS]  # the last count is of the chunks relayed
    assert tuple(attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ("error",)


@pytest.mark.parametrize("mode", ["force", "continuous"])
@pytest.mark.parametrize("shape", ["vllm", "openai"])
async def test_the_emulators_vllm_and_openai_shapes_read_as_direct(
    shape: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The emulator as vLLM (`"usage":null` last in every chunk once usage is asked) and as
    OpenAI (`"usage":null` before its `obfuscation` pad): a client that did not ask reads
    through the sidecar the bytes of a direct request that did not ask (id and time aside),
    and the span and access line carry the counts of the server's own usage chunk."""
    caplog.set_level("INFO", logger=semconv.ACCESS_LOGGER)
    body = chat(tokens=7) | {"sidestream": {"tokens": 7, "itl_ms": 1, "shape": shape}}
    async with stack("--usage", mode) as (port, upstream, spans, _, _):
        direct = await raw(upstream.port, body)
        asked = await raw(upstream.port, body | {"stream_options": {"include_usage": True}})
        forced = await raw(port, body)
        assert upstream.bodies[-1]["stream_options"]["include_usage"] is True
        await asyncio.sleep(0)
        span = span_of(spans)
    assert b'"usage":null' in asked and same_shape(forced) == same_shape(direct)
    (usage_chunk,) = [
        json.loads(line[6:])
        for line in asked.split(b"\n")
        if line.startswith(b'data: {"') and b'"choices":[]' in line
    ]
    usage = usage_chunk["usage"]
    assert span.attributes is not None
    assert span.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"] == 7
    assert span.attributes[semconv.USAGE_SOURCE] == "reported"
    line = json.loads([r for r in caplog.records if r.name == semconv.ACCESS_LOGGER][-1].message)
    assert (line["input_tokens"], line["output_tokens"]) == (usage["prompt_tokens"], 7)
    assert line["usage_source"] == "reported"


HOSTILE = [
    b"not json",
    b'[{"stream": true}]',
    b'{"model": "m", "stream": "yes", "messages": []}',
    b'{"model": "m", "stream": true, "stream": true, "messages": []}',
    b'{"model": "m", "stream": true, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "\xff"}]}',
    b'{"model": "m", "stream": true, "pad": "' + b"x" * (1 << 20) + b'", "messages": []}',
]


@pytest.mark.parametrize(
    "body", HOSTILE, ids=["not-json", "array", "stream-yes", "dup", "deep", "bad-utf8", "huge"]
)
async def test_odd_and_hostile_bodies_reach_the_upstream_byte_for_byte(body: bytes) -> None:
    """A body that is not a plain streaming JSON object within the limit is forwarded exactly
    as sent: no usage forced, no crash, and the upstream's own answer (never a 500 of ours)."""
    async with stack() as (port, upstream, _, _, _):
        response = await request(port, "POST", CHAT, body=body)
        await asyncio.wait_for(response.body(), 10)
        response.close()
    assert upstream.raw == [body]
    assert response.status != 500


@pytest.mark.parametrize("end", ["first_token_timeout", "upstream_reset"])
async def test_an_early_end_before_or_between_tokens_is_counted(end: str) -> None:
    """A first-token timeout reports 0 output tokens `counted`; an upstream that resets
    mid-stream reports the tokens relayed before it, `counted`; both with finish reasons
    `["error"]`."""
    spans = InMemorySpanExporter()
    telemetry = Telemetry(
        span_processor=SimpleSpanProcessor(spans), metric_readers=[InMemoryMetricReader()]
    )
    if end == "first_token_timeout":
        upstream_app: Any = make_app(stats=Stats())
        flags = ["--first-token-timeout", "0.3"]
        body = json.dumps(chat(tokens=5, ttft_ms=3000)).encode()
        headers: list[tuple[str, str]] = []
    async with contextlib.AsyncExitStack() as stack_:
        if end == "first_token_timeout":
            up = await stack_.enter_async_context(serve(upstream_app))
        else:
            faulty = await stack_.enter_async_context(FaultyUpstream())
            up, flags, headers = faulty.port, [], [("X-Fault", "rst")]
            body = json.dumps(chat()).encode()
        settings = load(["--upstream", f"http://127.0.0.1:{up}", *flags], environ={})
        guard = build_guard(settings, StreamRegistry(), telemetry)
        port = await stack_.enter_async_context(serve(guard, "sidecar"))
        response = await request(port, "POST", CHAT, body=body, headers=headers)
        await asyncio.wait_for(response.body(), 10)
        response.close()
        async with asyncio.timeout(5):
            while not [s for s in spans.get_finished_spans() if s.attributes]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    attributes = span_of(spans).attributes
    assert attributes is not None
    expected = 0 if end == "first_token_timeout" else 2  # the faulty upstream's two tokens
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == expected
    assert attributes[semconv.USAGE_SOURCE] == "counted"
    assert tuple(attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ("error",)


async def test_with_resume_the_hidden_usage_chunk_takes_no_event_id() -> None:
    """Forced usage and resume together: the usage chunk is hidden before events are
    stamped, so the client's ids run 1..n without a gap, and no usage reaches it."""
    async with stack("--resume") as (port, upstream, _, _, _):
        text = await raw(port, chat(tokens=6))
        assert upstream.bodies[-1]["stream_options"] == {"include_usage": True}
    assert b'"usage"' not in text
    ids = [int(line.rsplit(b":", 1)[1]) for line in text.split(b"\n") if line.startswith(b"id: ")]
    events = text.count(b"\n\n")
    assert ids == list(range(1, events + 1)), (ids, events)
    assert text.endswith(b"data: [DONE]\n\n") or b"data: [DONE]\n" in text
