"""A GenAI call that does not stream carries its usage: the JSON body's `usage` (OpenAI's and
Anthropic's shapes) fills the span, the token metrics and the access line, read as the body
passes (`middleware.telemetry.answer`: at most `TAIL` bytes kept), never held back, byte for
byte what the app sent. What does not apply to a response that is not a stream is null.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.guard import StreamGuard
from middleware.telemetry import Telemetry, semconv
from middleware.telemetry.answer import TAIL, Answer
from middleware.types import Receive, Scope, Send
from tests.support import clients
from tests.support.servers import serve

OPENAI = json.dumps(
    {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "model": "tiny-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
).encode()
ANTHROPIC = json.dumps(
    {
        "id": "msg_7",
        "type": "message",
        "role": "assistant",
        "model": "claude-tiny",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 4},
    }
).encode()
SHAPES = {
    "openai": ("/v1/chat/completions", OPENAI, (11, 3), "chatcmpl-7", "tiny-1", "length"),
    "anthropic": ("/v1/messages", ANTHROPIC, (12, 4), "msg_7", "claude-tiny", "end_turn"),
}
JSON_HEADERS = [(b"content-type", b"application/json")]


class Held:
    """An app that sends `body` in `piece`-byte messages and waits on `gate` after the first:
    the client must have the first piece before the app goes on."""

    def __init__(self, body: bytes, piece: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.body, self.piece, self.headers = body, piece, headers
        self.gate = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        pieces = [self.body[i : i + self.piece] for i in range(0, len(self.body), self.piece)]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            await send({"type": "http.response.body", "body": piece, "more_body": not last})
            if index == 0:
                await self.gate.wait()


def observed(caplog: pytest.LogCaptureFixture) -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(
        span_processor=SimpleSpanProcessor(exporter), metric_readers=[InMemoryMetricReader()]
    )
    caplog.set_level(logging.INFO, logger=semconv.ACCESS_LOGGER)
    return telemetry, exporter


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    records = caplog.records
    return [json.loads(r.getMessage()) for r in records if r.name == semconv.ACCESS_LOGGER]


async def through(app: Held, telemetry: Telemetry, path: str, model: str) -> bytes:
    """POST to `path` through the guard; the first piece is read before the gate opens."""
    async with serve(StreamGuard(app, telemetry=telemetry)) as port:
        body = json.dumps({"model": model, "max_tokens": 3}).encode()
        response = await clients.request(port, "POST", path, body=body)
        try:
            async with asyncio.timeout(5):  # held back, the first piece would never come
                first = await response.chunk()
            app.gate.set()
            rest = await response.body()
        finally:
            response.close()
        await asyncio.sleep(0)  # the record is finished as the request's task ends
    assert first is not None
    return first + rest


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_calls_usage_fills_the_span_the_token_metrics_and_the_access_line(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a non-streaming completion, sent in 5-byte pieces (its usage key cut across
    them), reaches the client byte for byte and piece by piece (the first before the app
    sends the second); its usage, id, model and finish reason are on the span, its tokens in
    `gen_ai.client.token.usage`, and the access line has the tokens (`reported`), the bytes,
    and null where a stream's fields do not apply."""
    path, body, (prompt, completion), response_id, response_model, reason = SHAPES[shape]
    telemetry, exporter = observed(caplog)
    got = await through(Held(body, 5, JSON_HEADERS), telemetry, path, "asked-model")
    assert got == body
    (span,) = exporter.get_finished_spans()
    a = dict(span.attributes or {})
    assert span.name == "chat asked-model"
    assert a[semconv.GEN_AI_USAGE_INPUT_TOKENS] == prompt
    assert a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == completion
    assert a[semconv.USAGE_SOURCE] == "reported"
    assert a[semconv.GEN_AI_RESPONSE_ID] == response_id
    assert a[semconv.GEN_AI_RESPONSE_MODEL] == response_model
    assert list(a[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == [reason]  # type: ignore[arg-type]
    assert a[semconv.BYTES] == len(body)
    assert semconv.TOKENS not in a and semconv.CHUNKS not in a
    usage = {m.name: m for m in telemetry.metrics()}[semconv.METRIC_TOKEN_USAGE]
    sums = {
        p.attributes[semconv.GEN_AI_TOKEN_TYPE]: p.sum  # type: ignore[index, union-attr]
        for p in usage.data.data_points  # type: ignore[union-attr]
    }
    assert sums == {"input": prompt, "output": completion}
    (line,) = access_lines(caplog)
    assert line["stream"] is False and line["model"] == "asked-model"
    assert (line["input_tokens"], line["output_tokens"]) == (prompt, completion)
    assert line["usage_source"] == "reported" and line["bytes"] == len(body)
    for key in ("tokens", "chunks", "keepalives", "ttft_ms", "itl_p50_ms", "tokens_per_s"):
        assert line[key] is None, key


async def test_a_body_past_the_tail_gives_its_usage_from_the_tail_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: a 1 MiB completion whose text quotes a `"usage": {...}` of its own (escaped, as
    JSON text must be) passes unchanged in 3 KiB pieces; the usage reported is the body's own,
    found in its last `TAIL` bytes, which is all that was kept of it."""
    decoy = '"usage": {"prompt_tokens": 999, "completion_tokens": 999}'
    text = ("x" * 1000 + decoy) * 1000
    body = json.dumps(
        {
            "id": "chatcmpl-big",
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 1000},
        }
    ).encode()
    assert len(body) > 16 * TAIL and body.count(b'\\"usage\\"') == 1000
    telemetry, exporter = observed(caplog)
    got = await through(Held(body, 3 * 1024, JSON_HEADERS), telemetry, "/v1/chat/completions", "m")
    assert got == body
    (line,) = access_lines(caplog)
    assert (line["input_tokens"], line["output_tokens"]) == (21, 1000)
    assert line["bytes"] == len(body)
    a = dict(exporter.get_finished_spans()[0].attributes or {})
    assert semconv.GEN_AI_RESPONSE_ID not in a  # at the start of the body: not kept


def test_what_is_kept_of_a_body_never_exceeds_the_tail() -> None:
    """Rule: however a long body arrives (small pieces, pieces larger than `TAIL`), the copy
    kept is at most `TAIL` bytes, and it is the body's last bytes."""
    answer = Answer(JSON_HEADERS, read=True)
    body = bytes(range(256)) * 12_000  # ~3 MiB
    sent = 0
    for size in (1, 7, 4096, TAIL + 1, 3 * TAIL, 100):
        for _ in range(3):
            answer.took(body[sent : sent + size])
            sent += size
            assert answer.tail is not None and len(answer.tail) <= TAIL
    assert bytes(answer.tail) == body[sent - TAIL : sent] and answer.size == sent


@pytest.mark.parametrize(
    ("case", "headers", "body"),
    [
        ("not json", JSON_HEADERS, b'{"usage": {"prompt_tokens": 1, "completion_tok'),
        ("json list", JSON_HEADERS, b'[{"usage": {"prompt_tokens": 1}}]'),
        ("not json type", [(b"content-type", b"text/plain")], OPENAI),
        ("gzip", [*JSON_HEADERS, (b"content-encoding", b"gzip")], gzip.compress(OPENAI)),
    ],
)
async def test_a_body_without_readable_usage_passes_unchanged_and_reports_none(
    case: str, headers: list[tuple[bytes, bytes]], body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a truncated JSON body, a JSON list, a body that is not JSON, and a compressed
    one pass byte for byte; no usage is made up (null tokens, no usage source), the bytes are
    still counted, and nothing raises."""
    telemetry, exporter = observed(caplog)
    got = await through(Held(body, 4, headers), telemetry, "/v1/chat/completions", "m")
    assert got == body
    lines = access_lines(caplog)
    if case == "not json type":  # a 200 that is not JSON: not a GenAI call, so no line
        assert lines == []
        (span,) = exporter.get_finished_spans()
        assert span.name == "POST" and dict(span.attributes or {})[semconv.BYTES] == len(body)
        return
    (line,) = lines
    assert line["input_tokens"] is None and line["output_tokens"] is None
    assert line["usage_source"] is None and line["bytes"] == len(body)
