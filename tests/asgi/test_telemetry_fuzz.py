"""Telemetry's token counting against upstream reads cut anywhere.

The guard counts most tokens on a fast path (the stream's learned frame, `Frame.matches`)
that only sees chunks starting at an event boundary; an upstream's reads can end at any
byte. Whatever the cuts, the bytes must pass unchanged and the span must count what the
stream holds.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.dialects import StreamStats, select
from middleware.guard import StreamGuard
from middleware.sse import SSEScanner
from middleware.telemetry import Telemetry, semconv
from middleware.telemetry.observed import ObservedCycle
from middleware.types import Message
from tests.support.apps import SCOPE, SSE_HEADERS

BASE = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1730000000, "model": "m"}


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return event({**BASE, "choices": [choice], **top})


def completion_chunk(text: str, finish: str | None = None, **top: Any) -> bytes:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return event({**BASE, "object": "text_completion", "choices": [choice], **top})


# Per API: its path, the key before a token's text, its first chunk, a token chunk, its last.
SHAPES = {
    "chat": (
        "/v1/chat/completions",
        b'"content":"',
        chat_chunk({"role": "assistant", "content": ""}),
        lambda text, **top: chat_chunk({"content": text}, **top),
        chat_chunk({}, "stop"),
    ),
    "completions": (
        "/v1/completions",
        b'"text":"',
        completion_chunk(""),
        completion_chunk,
        completion_chunk("", "stop"),
    ),
}


contents = st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=6), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SHAPES)), contents, st.booleans(), st.data())
def test_token_counts_and_bytes_survive_reads_cut_anywhere(
    api: str, texts: list[str], stamped: bool, data: st.DataObject
) -> None:
    """A chat or completions stream (first chunk, token chunks with any text — empty,
    quotes, backslashes, non-ASCII — with or without a per-chunk tail like the emulator's
    stamp, finish, usage, [DONE]) cut into reads at arbitrary bytes: the client gets the
    same bytes, the stream completes, and the span counts one token per non-empty text and
    the usage."""
    path, key, role, token, last = SHAPES[api]
    tokens = [token(t, **({"t": 10**18 + i} if stamped else {})) for i, t in enumerate(texts)]
    usage = event({**BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})
    end = last + usage + b"data: [DONE]\n\n"
    stream = role + b"".join(tokens) + end
    # Cuts anywhere, and often where the fast path looks: chunk ends and content starts.
    marks, start = [], 0
    for piece in (role, *tokens):
        content = start + piece.index(key) + len(key)
        start += len(piece)
        marks += [content - 1, content, content + 1, start - 1, start]
    anywhere = st.integers(min_value=1, max_value=len(stream) - 1)
    cuts = data.draw(st.lists(st.one_of(anywhere, st.sampled_from(marks)), max_size=25))
    if data.draw(st.booleans()):  # or at every chunk's end, and near some contents' start
        offset = data.draw(st.sampled_from([-1, 0, 1]))
        pieces = len(marks) // 5
        inside = data.draw(st.lists(st.booleans(), min_size=pieces, max_size=pieces))
        cuts += marks[4::5] + [
            m + offset for m, cut in zip(marks[1::5], inside, strict=True) if cut
        ]
    points = sorted(set(cuts) - {0, len(stream)})
    reads = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]

    out, attributes = relay(path, reads)
    assert out == stream
    assert attributes[semconv.OUTCOME] == "completed"
    assert attributes[semconv.TOKENS] == sum(1 for t in texts if t)
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    assert attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)


def relay(path: str, reads: list[bytes]) -> tuple[bytes, dict[str, Any]]:
    """`reads` sent by an app through StreamGuard with telemetry: the bytes the client got
    and the stream's span attributes."""
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(span_processor=SimpleSpanProcessor(exporter))
    sent: list[Message] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for read in reads:
            await send({"type": "http.response.body", "body": read, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def run() -> None:
        scope = {**SCOPE, "path": path, "raw_path": path.encode()}
        await StreamGuard(app, telemetry=telemetry, keepalive_interval=None)(scope, receive, send)

    asyncio.run(run())
    telemetry.shutdown()
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    (span,) = exporter.get_finished_spans()
    return out, dict(span.attributes or {})


# Whole events of every kind a stream may hold, for reads that are groups of them.
EVENTS = [
    chat_chunk({"role": "assistant", "content": ""}),
    chat_chunk({"content": "a"}),
    chat_chunk({"content": "b\n\ndata: c"}),  # a line end and a field inside the text
    chat_chunk({"content": ""}),
    chat_chunk({}, "stop"),
    event({**BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
    b": keep-alive\n\n",
    b"event: message\n" + chat_chunk({"content": "d"}),
    b'data: {"choices":[{"delta":\ndata: {"content":"e"}}]}\n\n',  # one event, two lines
    b"data: \n\n",
    b"data:" + chat_chunk({"content": "f"})[5:],  # no space after the colon
    b"data: [DONE]\n\n",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=4), max_size=10))
def test_reads_of_whole_events_count_as_the_scanner_sees_them(groups: list[list[bytes]]) -> None:
    """Reads that each hold whole events (the usual chunk, the finish + usage + [DONE] group
    servers end with, or anything else): however the guard splits them, the span counts
    what the SSE scanner and the dialect make of the stream read whole."""
    reads = [b"".join(group) for group in groups]
    stream = b"".join(reads)
    path = "/v1/chat/completions"
    stats = StreamStats()
    dialect = select(path)
    assert dialect is not None
    for parsed in SSEScanner().feed(stream):
        dialect.observe(parsed, stats)
    out, attributes = relay(path, reads or [b""])
    assert out == stream
    assert attributes[semconv.TOKENS] == stats.tokens
    usage = stats.output_tokens if stats.output_tokens is not None else stats.tokens
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == usage
    reasons = attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS, ())
    assert reasons == tuple(stats.finish_reasons)


def test_a_token_shaped_read_after_a_read_that_ends_inside_an_event_joins_that_event() -> None:
    """The token path's frame check only decides reads that start at an event boundary. A
    read that ends after a data line but before the blank line leaves the stream inside an
    event; the next read, though shaped like a whole token chunk, adds a data line to that
    same event: one event, one token — and the finish chunk after it is parsed as itself."""
    _, _, role, token, last = SHAPES["chat"]
    usage = event({**BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})
    inside = token("b")[:-1]  # `data: {...}\n`: the event is not ended
    reads = [role, token("a"), inside, token("c"), last, usage, b"data: [DONE]\n\n"]
    out, attributes = relay("/v1/chat/completions", reads)
    assert out == b"".join(reads)
    assert attributes[semconv.TOKENS] == 2  # "a", and "b" + "c" as one event
    assert attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert attributes[semconv.OUTCOME] == "completed"


@pytest.mark.parametrize("stamped", [False, True], ids=["same-tail", "stamped-tail"])
def test_token_chunks_an_app_sends_take_the_token_path(
    monkeypatch: pytest.MonkeyPatch, stamped: bool
) -> None:
    """Chunks the app sends through `send` (not the server's `send_nowait`) take the token
    path too once the frame is learned: only the first chunks and the end reach the dialect
    (`_observe`), and the span's tokens, chunks and bytes count every chunk."""
    observed: list[bytes] = []
    observe = ObservedCycle._observe

    def counting(self: ObservedCycle, body: bytes, now: float, stats: Any) -> None:
        observed.append(body)
        observe(self, body, now, stats)

    monkeypatch.setattr(ObservedCycle, "_observe", counting)
    _, _, role, token, last = SHAPES["chat"]
    tokens = [token(f"t{i}", **({"t": 10**18 + i} if stamped else {})) for i in range(30)]
    reads = [role, *tokens, last, b"data: [DONE]\n\n"]
    out, attributes = relay("/v1/chat/completions", reads)
    assert out == b"".join(reads)
    assert observed == [role, tokens[0], last, b"data: [DONE]\n\n"]
    assert attributes[semconv.TOKENS] == 30
    assert attributes[semconv.CHUNKS] == len(reads)
    assert attributes[semconv.BYTES] == len(out)
