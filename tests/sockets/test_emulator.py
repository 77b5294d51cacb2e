"""The upstream emulator: OpenAI chunk shapes, pacing, stamps, EventSource resume,
cancellation bookkeeping, input validation and the openai SDK — over real sockets. Its CLI
as a process: tests/system/test_emulator_cli.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam

from sidecar.emulator import Stats, make_app
from sidecar.emulator.plan import Headers, plan_post
from sidecar.emulator.text import PASSAGE, split_tokens
from tests.support.clients import RawResponse, request
from tests.support.servers import serve

FAST = {"ttft_ms": 0, "itl_ms": 0}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@dataclass
class Emu:
    port: int
    stats: Stats


module_loop = pytest.mark.asyncio(loop_scope="module")  # the shared server lives in that loop


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[Emu]:
    """One emulator for the module (starting and stopping uvicorn costs ~0.2 s each)."""
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield Emu(port, stats)


@pytest.fixture
def emu(server: Emu) -> Emu:
    """The module's emulator with its counters at zero."""
    server.stats.reset()
    return server


async def post(
    port: int, path: str, body: Any, headers: list[tuple[str, str]] | None = None
) -> RawResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await request(port, "POST", path, body=raw, headers=headers)


def events(body: bytes) -> list[dict[str, str]]:
    """Split an SSE body into events ({"id": ..., "data": ...}); the emulator writes LF only."""
    out = []
    for block in body.split(b"\n\n"):
        if not block:
            continue
        event: dict[str, str] = {}
        for line in block.decode().split("\n"):
            name, _, value = line.partition(": ")
            event[name] = value
        out.append(event)
    return out


def datas(body: bytes) -> list[Any]:
    """The decoded `data:` payloads; "[DONE]" stays a string."""
    return [e["data"] if e["data"] == "[DONE]" else json.loads(e["data"]) for e in events(body)]


async def stream_chat(port: int, **fields: Any) -> list[Any]:
    body = {"model": "m-1", "messages": MESSAGES, "stream": True, **fields}
    response = await post(port, "/v1/chat/completions", body)
    try:
        assert response.status == 200
        return datas(await response.body())
    finally:
        response.close()


def contents(chunks: list[Any]) -> list[str]:
    return [
        c["choices"][0]["delta"]["content"]
        for c in chunks[1:-1]
        if c["choices"] and "content" in c["choices"][0]["delta"]
    ]


@module_loop
async def test_chat_stream_chunk_sequence(emu: Emu) -> None:
    """Chat streaming sends role chunk, one chunk per token, finish_reason, usage with
    choices [], then [DONE], each chunk with the same id, the chunk object and the echoed model."""
    body = {
        "model": "m-1", "messages": MESSAGES, "stream": True,
        "stream_options": {"include_usage": True}, "sidestream": {**FAST, "tokens": 5},
    }  # fmt: skip
    response = await post(emu.port, "/v1/chat/completions", body)
    assert response.status == 200
    assert response.header("content-type") == "text/event-stream; charset=utf-8"
    assert response.header("content-length") is None
    chunks = datas(await response.body())
    response.close()
    assert chunks[-1] == "[DONE]"
    role, *tokens, finish, usage, _ = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [t["choices"][0]["delta"]["content"] for t in tokens] == list(split_tokens(PASSAGE)[:5])
    assert all(t["choices"][0]["finish_reason"] is None for t in [role, *tokens])
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == 5 + usage["usage"]["prompt_tokens"]
    for chunk in chunks[:-1]:
        assert chunk["id"] == role["id"] and chunk["id"].startswith("chatcmpl-")
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["model"] == "m-1"
        assert isinstance(chunk["created"], int)
    assert emu.stats.streams_started == emu.stats.streams_completed == 1


@module_loop
async def test_completions_stream_uses_text_and_no_role_chunk(emu: Emu) -> None:
    """/v1/completions streams text_completion chunks with "text", no role chunk, and no usage
    chunk unless include_usage asks for it."""
    body = {"prompt": "Say hi", "stream": True, "sidestream": {**FAST, "tokens": 3}}
    response = await post(emu.port, "/v1/completions", body)
    chunks = datas(await response.body())
    response.close()
    *tokens, finish, done = chunks
    assert done == "[DONE]"
    assert [t["choices"][0]["text"] for t in tokens] == list(split_tokens(PASSAGE)[:3])
    assert finish["choices"][0] == {
        "index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "stop_reason": None
    }  # fmt: skip
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in tokens)
    assert all(c["model"] == "emulator" for c in tokens)


@module_loop
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_cuts_with_length(emu: Emu, field: str) -> None:
    """max_tokens (or max_completion_tokens) below the planned count cuts the stream there
    and the finish_reason is "length"; usage counts the tokens sent."""
    chunks = await stream_chat(
        emu.port, sidestream={**FAST, "tokens": 10}, stream_options={"include_usage": True},
        **{field: 4},
    )  # fmt: skip
    assert len(contents(chunks)) == 4
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["usage"]["completion_tokens"] == 4


@module_loop
async def test_max_tokens_above_plan_finishes_with_stop(emu: Emu) -> None:
    """A max_tokens above the planned count changes nothing: finish_reason "stop"."""
    chunks = await stream_chat(emu.port, sidestream={**FAST, "tokens": 3}, max_tokens=50)
    assert len(contents(chunks)) == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "hi"})],
)
@module_loop
async def test_non_streaming_json_with_content_length(
    emu: Emu, path: str, extra: dict[str, Any]
) -> None:
    """stream false returns one JSON completion with usage, finish_reason and Content-Length."""
    body = {"model": "m-2", "max_tokens": 6, "sidestream": FAST, **extra}
    response = await post(emu.port, path, body)
    raw = await response.body()
    response.close()
    assert response.status == 200
    assert response.header("content-type") == "application/json"
    assert response.header("content-length") == str(len(raw))
    data = json.loads(raw)
    choice = data["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert text == "".join(split_tokens(PASSAGE)[:6])
    assert choice["finish_reason"] == "length"
    assert data["model"] == "m-2"
    assert data["object"] == ("chat.completion" if "chat" in path else "text_completion")
    assert data["usage"]["completion_tokens"] == 6
    assert emu.stats.streams_started == 0


@module_loop
async def test_pacing_ttft_and_itl_honoured(emu: Emu) -> None:
    """Headers and the role chunk go at once; the first content token waits ttft_ms; the
    tokens after it follow every itl_ms (generous upper bounds)."""
    body = {
        "messages": MESSAGES,
        "stream": True,
        "sidestream": {"ttft_ms": 300, "itl_ms": 30, "tokens": 6},
    }
    start = time.monotonic()
    response = await post(emu.port, "/v1/chat/completions", body)
    headers_at = time.monotonic()
    await response.body()
    response.close()
    arrivals = [t for t, _ in response.arrivals]
    role_at, first_at, last_at = arrivals[0], arrivals[1], arrivals[6]
    assert headers_at - start < 0.25
    assert role_at - start < 0.25
    assert first_at - start >= 0.3 - 0.005
    # tokens follow a schedule (ttft + i * itl from the headers), so measure from the start:
    # a late first token shortens the gap after it but never brings the last one forward
    assert last_at - start >= 0.3 + 5 * 0.030 - 0.005
    assert last_at - start < 0.3 + 5 * 0.030 + 1.0


@module_loop
async def test_pacing_headers_and_body_precedence(emu: Emu) -> None:
    """X-Emulator-* headers set pacing; the body's "sidestream" field wins over them."""
    headers = [("X-Emulator-TTFT-Ms", "0"), ("X-Emulator-ITL-Ms", "0"), ("X-Emulator-Tokens", "7")]
    body = {"messages": MESSAGES, "stream": True}
    response = await post(emu.port, "/v1/chat/completions", body, headers)
    assert len(contents(datas(await response.body()))) == 7
    response.close()
    body["sidestream"] = {"tokens": 2}
    response = await post(emu.port, "/v1/chat/completions", body, headers)
    assert len(contents(datas(await response.body()))) == 2
    response.close()


def test_default_pacing_looks_like_a_model() -> None:
    """Without pacing: 200 ms to the first token, 20 ms between tokens, 64 tokens."""
    plan = plan_post("chat", json.dumps({"messages": MESSAGES}).encode(), Headers())
    assert (plan.ttft, plan.itl, plan.count, plan.finish_reason) == (0.2, 0.02, 64, "stop")
    assert plan.model == "emulator" and not plan.stream


@module_loop
async def test_stamps_only_with_header(emu: Emu) -> None:
    """X-Emulator-Stamp: 1 adds sidestream_sent_ns (monotonic_ns, non-decreasing, not in the
    future) to every content chunk; without the header no chunk has it."""
    body = {"messages": MESSAGES, "stream": True, "sidestream": {**FAST, "tokens": 4}}
    response = await post(emu.port, "/v1/chat/completions", body, [("X-Emulator-Stamp", "1")])
    chunks = datas(await response.body())
    response.close()
    stamps = [c["sidestream_sent_ns"] for c in chunks[1:5]]
    assert stamps == sorted(stamps) and stamps[-1] <= time.monotonic_ns()
    assert "sidestream_sent_ns" not in chunks[0] and "sidestream_sent_ns" not in chunks[5]
    plain = await stream_chat(emu.port, sidestream={**FAST, "tokens": 4})
    assert not any("sidestream_sent_ns" in c for c in plain[:-1])


@module_loop
@pytest.mark.parametrize("how", ["header", "body"])
async def test_a_content_stamp_is_the_token_text_and_leaves_the_chunk_shape_alone(
    emu: Emu, how: str
) -> None:
    """`X-Emulator-Stamp: content` (or "stamp": "content") sends each content chunk's
    monotonic_ns as its text, and nothing else changes: the chunk's bytes are a plain
    chunk's with only the content string replaced (vLLM's shape: no per-chunk tail)."""
    sidestream: dict[str, object] = {**FAST, "tokens": 4}
    headers = [("X-Emulator-Stamp", "content")] if how == "header" else []
    if how == "body":
        sidestream["stamp"] = "content"
    body = {"messages": MESSAGES, "stream": True, "sidestream": sidestream}
    response = await post(emu.port, "/v1/chat/completions", body, headers)
    raw = await response.body()
    response.close()
    chunks = datas(raw)
    stamps = [int(c["choices"][0]["delta"]["content"]) for c in chunks[1:5]]
    assert stamps == sorted(stamps) and stamps[-1] <= time.monotonic_ns()
    assert stamps[0] > time.monotonic_ns() - 60 * 10**9
    assert all(set(c) == set(chunks[0]) for c in chunks[1:5])  # no added field
    lines = [line for line in raw.split(b"\n\n") if b'"delta":{"content":"' in line]
    assert len(lines) == 4
    assert len({line[line.index(b'"},"logprobs"') :] for line in lines}) == 1  # one tail


@pytest.mark.parametrize(
    "text",
    [
        "नमस्ते दुनिया, यह एक परीक्षण है। 🙏🏽 👨‍👩‍👧‍👦 🇮🇳 done ",
        '  leading spaces and\ttabs\nnewlines "quotes" \\ back',
        "中文没有空格所以一个词可能很长很长很长很长很长很长",
    ],
)
@module_loop
async def test_custom_text_survives_byte_exact(emu: Emu, text: str) -> None:
    """A given `text` is streamed once, split without breaking a code point: the joined
    tokens equal the text byte for byte, and the wire carries raw UTF-8."""
    body = {"messages": MESSAGES, "stream": True, "sidestream": {**FAST, "text": text}}
    response = await post(emu.port, "/v1/chat/completions", body)
    raw = await response.body()
    response.close()
    tokens = contents(datas(raw))
    assert len(tokens) > 1
    assert "".join(tokens).encode() == text.encode()
    assert tokens[0].encode() in raw


@module_loop
async def test_get_stream_ids_and_last_event_id_resume(emu: Emu) -> None:
    """GET /v1/stream gives content event n `id: n` and the finish event `id: <count>`;
    Last-Event-ID: k resumes at token k+1 without a role chunk, and is recorded."""
    path = "/v1/stream?tokens=5&ttft_ms=0&itl_ms=0&model=x"
    response = await request(emu.port, "GET", path)
    assert response.header("access-control-allow-origin") == "*"
    evs = events(await response.body())
    response.close()
    assert [e.get("id") for e in evs] == [None, "0", "1", "2", "3", "4", "5", None]
    full = contents([json.loads(e["data"]) for e in evs[:-1]] + ["[DONE]"])
    response = await request(emu.port, "GET", path, headers=[("Last-Event-ID", "2")])
    evs = events(await response.body())
    response.close()
    assert [e.get("id") for e in evs] == ["3", "4", "5", None]
    resumed = [json.loads(e["data"])["choices"][0]["delta"].get("content") for e in evs[:2]]
    assert resumed == full[3:]
    assert emu.stats.last_event_id == "2"
    debug = await request(emu.port, "GET", "/debug/last-event-id")
    assert json.loads(await debug.body()) == {"last_event_id": "2"}
    debug.close()


@module_loop
async def test_get_stream_past_the_end_is_204(emu: Emu) -> None:
    """A Last-Event-ID at or past the finish event gets 204, which stops EventSource."""
    response = await request(
        emu.port, "GET", "/v1/stream?tokens=3", headers=[("Last-Event-ID", "3")]
    )
    assert response.status == 204
    response.close()


@module_loop
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_client_leaving_mid_stream_is_counted_at_once(emu: Emu, how: str) -> None:
    """When the client goes away mid-stream the emulator stops at once (long before its next
    token is due) and counts a cancelled stream with a timestamp in /debug/stats."""
    body = {
        "messages": MESSAGES,
        "stream": True,
        "sidestream": {"ttft_ms": 0, "itl_ms": 2000, "tokens": 100},
    }
    response = await post(emu.port, "/v1/chat/completions", body)
    await response.chunk()  # role
    await response.chunk()  # first token
    left_at = time.monotonic()
    response.close() if how == "close" else response.reset()
    for _ in range(300):  # poll the counter, up to ~1.5 s
        if emu.stats.streams_cancelled:
            break
        await asyncio.sleep(0.005)
    assert emu.stats.streams_cancelled == 1
    assert left_at <= emu.stats.cancel_times[-1] < left_at + 1.5
    debug = await request(emu.port, "GET", "/debug/stats")
    snapshot = json.loads(await debug.body())
    debug.close()
    assert snapshot["streams_cancelled"] == 1 and snapshot["streams_completed"] == 0
    assert snapshot["streams_active"] == 0
    assert snapshot["cancel_times"] == list(emu.stats.cancel_times)


@module_loop
async def test_fast_streams_run_side_by_side(emu: Emu) -> None:
    """itl_ms 0 streams many tokens, one chunk each, and concurrent streams all complete."""
    results = await asyncio.gather(
        *(stream_chat(emu.port, sidestream={**FAST, "tokens": 500}) for _ in range(4))
    )
    assert all(len(contents(chunks)) == 500 for chunks in results)
    assert emu.stats.streams_completed == 4


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
Case = tuple[str, bytes | dict[str, Any] | list[Any], list[tuple[str, str]], str | None]
BAD_REQUESTS: list[Case] = [
    (CHAT, b"{not json", [], None),
    (CHAT, b"\xff\xfe", [], None),
    (CHAT, b"", [], None),
    (CHAT, [1, 2], [], None),
    (CHAT, {"model": "m"}, [], "messages"),
    (CHAT, {"messages": []}, [], "messages"),
    (CHAT, {"messages": "hi"}, [], "messages"),
    (CHAT, {"messages": ["hi"]}, [], "messages[0]"),
    (CHAT, {"messages": [{"content": "hi"}]}, [], "messages[0]"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, [], "messages[0].content"),
    (CHAT, {"messages": MESSAGES, "model": 3}, [], "model"),
    (CHAT, {"messages": MESSAGES, "stream": "yes"}, [], "stream"),
    (CHAT, {"messages": MESSAGES, "stream": 1}, [], "stream"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 0}, [], "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": -3}, [], "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 2.5}, [], "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": "9"}, [], "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": True}, [], "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_completion_tokens": 0}, [], "max_completion_tokens"),
    (CHAT, {"messages": MESSAGES, "n": 2}, [], "n"),
    (CHAT, {"messages": MESSAGES, "stream_options": {"include_usage": True}}, [], "stream_options"),
    (CHAT, {"messages": MESSAGES, "stream": True, "stream_options": []}, [], "stream_options"),
    (CHAT, {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "y"}}, [],
     "stream_options.include_usage"),
    (CHAT, {"messages": MESSAGES, "sidestream": 5}, [], "sidestream"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"ttft": 5}}, [], "sidestream.ttft"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"ttft_ms": -1}}, [], "sidestream.ttft_ms"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"ttft_ms": 600001}}, [], "sidestream.ttft_ms"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"itl_ms": "5"}}, [], "sidestream.itl_ms"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"itl_ms": None}}, [], "sidestream.itl_ms"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"tokens": 100001}}, [], "sidestream.tokens"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"tokens": -1}}, [], "sidestream.tokens"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"tokens": 1.0}}, [], "sidestream.tokens"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"text": ""}}, [], "sidestream.text"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"text": ["a"]}}, [], "sidestream.text"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"stamp": 1}}, [], "sidestream.stamp"),
    (CHAT, {"messages": MESSAGES, "sidestream": {"stamp": "end"}}, [], "sidestream.stamp"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-Stamp", "yes")], "X-Emulator-Stamp"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-TTFT-Ms", "soon")], "X-Emulator-TTFT-Ms"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-ITL-Ms", "nan")], "X-Emulator-ITL-Ms"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-ITL-Ms", "1e9")], "X-Emulator-ITL-Ms"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-Tokens", "many")], "X-Emulator-Tokens"),
    (CHAT, {"messages": MESSAGES}, [("X-Emulator-Tokens", "1000000")], "X-Emulator-Tokens"),
    (COMPLETIONS, {"model": "m"}, [], "prompt"),
    (COMPLETIONS, {"prompt": 5}, [], "prompt"),
    (COMPLETIONS, {"prompt": []}, [], "prompt"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, [], "prompt"),
    (COMPLETIONS, {"prompt": [1, -2]}, [], "prompt"),
    (COMPLETIONS, {"prompt": "hi", "stream": None, "sidestream": {"itl_ms": 1e400}}, [],
     "sidestream.itl_ms"),
]  # fmt: skip


@module_loop
@pytest.mark.parametrize(("path", "body", "headers", "param"), BAD_REQUESTS)
async def test_bad_requests_get_openai_400(
    emu: Emu, path: str, body: Any, headers: list[tuple[str, str]], param: str | None
) -> None:
    """Each malformed request gets a 400 OpenAI-style JSON error naming the offending param."""
    response = await post(emu.port, path, body, headers)
    data = json.loads(await response.body())
    response.close()
    assert response.status == 400
    assert response.header("content-type") == "application/json"
    assert set(data["error"]) == {"message", "type", "param", "code"}
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["param"] == param
    assert emu.stats.streams_started == 0


@pytest.mark.parametrize(
    "query", ["tokens=x", "ttft_ms=-5", "itl_ms=700000", "max_tokens=0", "text=", "tokens=%ff"]
)
@module_loop
async def test_bad_get_stream_query_gets_400(emu: Emu, query: str) -> None:
    """GET /v1/stream validates its query like the body fields: 400 JSON, no stream."""
    response = await request(emu.port, "GET", "/v1/stream?" + query)
    data = json.loads(await response.body())
    response.close()
    assert response.status == 400 and data["error"]["type"] == "invalid_request_error"


@module_loop
async def test_unknown_path_wrong_method_and_big_body(emu: Emu) -> None:
    """Unknown path → 404 JSON, wrong method → 405 JSON with Allow, a body announced over
    the limit → 413 JSON."""
    response = await request(emu.port, "GET", "/v2/nothing")
    assert response.status == 404 and "error" in json.loads(await response.body())
    response.close()
    response = await request(emu.port, "GET", "/v1/chat/completions")
    assert response.status == 405 and response.header("allow") == "POST"
    assert json.loads(await response.body())["error"]["code"] == "method_not_allowed"
    response.close()
    response = await request(emu.port, "POST", "/health")
    assert response.status == 405
    response.close()
    big = [("Content-Length", str(5 * 1024 * 1024))]
    response = await request(emu.port, "POST", "/v1/chat/completions", headers=big)
    assert response.status == 413
    assert json.loads(await response.body())["error"]["code"] == "request_too_large"
    response.close()


@module_loop
async def test_body_over_limit_while_reading_is_413() -> None:
    """A chunked body that grows past max_body is refused with 413 once it crosses it."""
    async with serve(make_app(stats=Stats(), max_body=100)) as port:
        payload = json.dumps({"messages": MESSAGES, "pad": "x" * 200}).encode()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
        response = await request(
            port, "POST", CHAT, body=chunked, headers=[("Transfer-Encoding", "chunked")]
        )
        assert response.status == 413
        assert json.loads(await response.body())["error"]["type"] == "invalid_request_error"
        response.close()


@module_loop
async def test_models_and_health(emu: Emu) -> None:
    """GET /v1/models lists the "emulator" model; GET /health is 200 with an empty body."""
    response = await request(emu.port, "GET", "/v1/models")
    data = json.loads(await response.body())
    response.close()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["emulator"]
    response = await request(emu.port, "GET", "/health")
    assert response.status == 200 and await response.body() == b""
    response.close()


@module_loop
async def test_openai_sdk_sync_and_async(emu: Emu) -> None:
    """The official openai SDK, sync (in a thread) and async, streams the whole text and the
    usage chunk from the emulator."""
    base_url = f"http://127.0.0.1:{emu.port}/v1"
    expected = "".join(split_tokens(PASSAGE)[:12])

    def sync_run() -> tuple[str, Any]:
        with OpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="emulator", messages=MESSAGES, stream=True,
                stream_options={"include_usage": True},
                extra_headers={
                    "X-Emulator-TTFT-Ms": "0", "X-Emulator-ITL-Ms": "1", "X-Emulator-Tokens": "12"
                },
            )  # fmt: skip
            text, usage = "", None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                usage = chunk.usage or usage
            return text, usage

    text, usage = await asyncio.to_thread(sync_run)
    assert text == expected and usage is not None and usage.completion_tokens == 12

    async with AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="emulator", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True},
            extra_body={"sidestream": {"ttft_ms": 0, "itl_ms": 1, "tokens": 12}},
        )  # fmt: skip
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        assert text == expected and usage is not None and usage.total_tokens > 12
        completion = await client.completions.create(
            model="emulator", prompt="hi", max_tokens=3, extra_body={"sidestream": FAST}
        )
        assert completion.choices[0].text == "".join(split_tokens(PASSAGE)[:3])
        assert completion.choices[0].finish_reason == "length"
