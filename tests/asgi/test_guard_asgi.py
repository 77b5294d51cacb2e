"""StreamGuard at the ASGI level: hand-written receive/send, no server, no clock games.

These check the rules that do not depend on timing: pass-through, header rewriting,
decompression, terminal events and error responses.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import pytest

from middleware.guard import StreamGuard
from middleware.types import Message, Receive, Scope, Send
from tests.support.apps import DONE, ROLE, SCOPE, SSE_HEADERS, Probe, chunk, scripted
from tests.support.sseparse import parse


async def run(app: Any, scope: Scope = SCOPE, body: bytes = b"{}") -> list[Message]:
    """Drive `app` with one request and a client that never leaves; return what it sent."""
    sent: list[Message] = []
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    forever = asyncio.Event()

    async def receive() -> Message:
        if inbox:
            return inbox.pop(0)
        await forever.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def body_of(messages: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def headers_of(messages: list[Message]) -> dict[bytes, bytes]:
    start = next(m for m in messages if m["type"] == "http.response.start")
    return {k.lower(): v for k, v in start["headers"]}


async def test_lifespan_scope_passes_through_untouched() -> None:
    """Non-HTTP scopes reach the app with the very same receive and send."""
    seen: list[tuple[Scope, Receive, Send]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope, receive, send))

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    await StreamGuard(app)(scope, receive, send)
    assert seen == [(scope, receive, send)]


async def test_plain_response_is_byte_identical_with_content_length() -> None:
    """A non-streaming response keeps status, headers (Content-Length too) and bytes."""
    payload = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-a", b"1"),
    ]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    direct = await run(app)
    guarded = await run(StreamGuard(app))
    assert guarded == direct
    assert headers_of(guarded)[b"content-length"] == str(len(payload)).encode()


async def test_stream_headers_are_rewritten() -> None:
    """An SSE response loses Content-Length and hop-by-hop headers, gains no-buffering, and
    keeps the app's Cache-Control directives with no-transform added."""
    headers = SSE_HEADERS + [
        (b"content-length", b"999"),
        (b"cache-control", b"public, max-age=60"),
        (b"connection", b"keep-alive"),
        (b"x-request-id", b"abc"),
    ]
    sent = await run(StreamGuard(scripted([(0, chunk("hi"))], headers=headers)))
    got = headers_of(sent)
    assert b"content-length" not in got
    assert b"connection" not in got
    assert got[b"cache-control"] == b"public, max-age=60, no-transform"
    assert got[b"x-accel-buffering"] == b"no"
    assert got[b"x-request-id"] == b"abc"
    assert parse(body_of(sent)) == [("message", chunk("hi")[6:-2].decode(), "")]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
async def test_compressed_stream_is_decompressed_incrementally(encoding: str) -> None:
    """A gzip/deflate SSE body is inflated chunk by chunk and Content-Encoding is removed."""
    events = [ROLE] + [chunk(f"t{i}") for i in range(50)] + [DONE]
    if encoding == "gzip":
        packer = zlib.compressobj(wbits=31)
    elif encoding == "deflate":
        packer = zlib.compressobj(wbits=15)
    else:
        packer = zlib.compressobj(wbits=-15)
    script = [(0, packer.compress(e) + packer.flush(zlib.Z_SYNC_FLUSH)) for e in events]
    script.append((0, packer.flush()))
    headers = SSE_HEADERS + [(b"content-encoding", encoding.split("-")[0].encode())]
    sent = await run(StreamGuard(scripted(script, headers=headers)))
    assert b"content-encoding" not in headers_of(sent)
    assert body_of(sent) == b"".join(events)
    # decoded per chunk: each event left as its own body message, not held back
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert bodies[:3] == events[:3]


async def test_gzip_module_stream_roundtrip() -> None:
    """A body gzipped in one piece by the app (as gzip middleware would) arrives plain."""
    raw = ROLE + chunk("hello") + DONE
    headers = SSE_HEADERS + [(b"content-encoding", b"gzip")]
    sent = await run(StreamGuard(scripted([(0, gzip.compress(raw))], headers=headers)))
    assert body_of(sent) == raw


async def test_app_error_after_headers_ends_with_terminal_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception mid-stream becomes one OpenAI-style error event and a clean end, logged once."""
    sent = await run(StreamGuard(scripted([(0, ROLE), (0, chunk("a"))], fail_after=True)))
    assert sent[-1] == {"type": "http.response.body", "body": sent[-1]["body"], "more_body": False}
    events = parse(body_of(sent))
    error = json.loads(events[-1][1])["error"]
    assert set(error) == {"message", "type", "code"}
    assert [r.message for r in caplog.records if r.name == "sidestream"] == [
        "the application failed mid-stream"
    ]


async def test_app_error_before_headers_propagates() -> None:
    """Before headers an app exception is the server's to handle, as without the guard."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await run(StreamGuard(app))


async def test_terminal_event_closes_a_half_written_event() -> None:
    """A stream cut mid-line gets its line and event closed before the error event."""
    sent = await run(StreamGuard(scripted([(0, ROLE), (0, b'data: {"partial')], fail_after=True)))
    raw = body_of(sent)
    assert raw.endswith(b"\n\n")
    events = parse(raw)
    assert events[-2][1] == '{"partial'
    assert "error" in json.loads(events[-1][1])


async def test_first_token_timeout_before_headers_is_504_json() -> None:
    """No response within first_token_timeout: a 504 with an OpenAI-style JSON error body."""
    probe = Probe()
    guard = StreamGuard(
        scripted([(0, ROLE)], probe, pause_before_headers=5), first_token_timeout=0.05
    )
    sent = await run(guard)
    assert sent[0]["status"] == 504
    assert json.loads(body_of(sent))["error"]["code"] == "first_token_timeout"
    assert probe.cancelled_at is not None


async def test_drain_before_headers_is_503_with_retry_after() -> None:
    """A request still waiting for its response when the drain ends gets a retryable 503."""
    guard = StreamGuard(scripted([(0, ROLE)], pause_before_headers=5))
    task = asyncio.ensure_future(run(guard))
    await asyncio.sleep(0.02)
    await guard.registry.drain(timeout=0.01)
    sent = await task
    assert sent[0]["status"] == 503
    assert headers_of(sent)[b"retry-after"] == b"1"
    assert json.loads(body_of(sent))["error"]["code"] == "shutting_down"
    # and the next request is refused at the door
    later = await run(guard)
    assert later[0]["status"] == 503


async def test_max_streams_sheds_load_with_retry_after() -> None:
    """Past max_streams, a request gets 503 + Retry-After without reaching the app."""
    probe = Probe()
    guard = StreamGuard(scripted([(0, ROLE)], probe, pause_before_headers=5), max_streams=1)
    first = asyncio.ensure_future(run(guard))
    await asyncio.sleep(0.02)
    sent = await run(guard)
    assert probe.started is not None  # the first request holds the only slot
    assert sent[0]["status"] == 503 and headers_of(sent)[b"retry-after"] == b"1"
    assert json.loads(body_of(sent))["error"]["code"] == "too_many_streams"
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_handle_serves_as_call_does_with_no_coroutine_of_its_own() -> None:
    """`StreamGuard.handle` (what the sidecar's uvicorn serves) returns the awaitable that
    serves the request, not a coroutine of its own: a stream, a lifespan scope passed through
    and a refusal come out as they do through `__call__`."""
    script = [(0, ROLE), (0, chunk("hi")), (0, DONE)]
    guard = StreamGuard(scripted(script), max_streams=1)

    async def handled(scope: Scope = SCOPE) -> list[Message]:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            served = guard.handle(scope, receive, send)
            code = getattr(served, "cr_code", None)  # the request's own coroutine, if one
            assert code is None or code.co_name not in ("handle", "__call__")
            await served

        return await run(app, scope)

    assert body_of(await handled()) == body_of(await run(guard))
    seen: list[Scope] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}}
    await StreamGuard(inner).handle(lifespan, receive, send)
    assert seen == [lifespan]
    guard.registry.draining = True
    sent = await handled()
    assert sent[0]["status"] == 503


def test_bad_timeout_values_are_refused() -> None:
    """A zero or negative timeout is a configuration error, said at construction."""
    with pytest.raises(ValueError, match="idle_timeout"):
        StreamGuard(scripted([]), idle_timeout=0)


async def test_forced_usages_reading_is_not_held_while_the_stream_is_open() -> None:
    """Forced usage reads the request body in a coroutine of its own before the app runs;
    once done it is not held by the request (an open stream would keep its ~300 bytes for
    as long as it is open, thousands of them idle at once)."""
    import weakref

    from middleware import usage

    kept: list[weakref.ref[Any]] = []
    prepare = usage.prepare

    def watched(*args: Any) -> Any:
        forcing = prepare(*args)
        if forcing is not None:
            kept.append(weakref.ref(forcing))
        return forcing

    seen: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(bool(kept) and kept[0]() is None)  # while the app runs: gone
        await scripted([(0, ROLE), (0, chunk("a")), (0, DONE)])(scope, receive, send)

    usage.prepare = watched  # type: ignore[assignment]
    try:
        await run(StreamGuard(app, usage="force"), body=b'{"stream": true}')
    finally:
        usage.prepare = prepare  # type: ignore[assignment]
    assert seen == [True]


@pytest.mark.parametrize(
    "given, sent",
    [
        ([], b"no-cache, no-transform"),  # the app said nothing: the guard's default
        ([b"no-store"], b"no-store, no-transform"),
        ([b"private"], b"private, no-transform"),
        ([b"no-cache"], b"no-cache, no-transform"),
        ([b"no-transform"], b"no-transform"),
        ([b"private, max-age=0", b"No-Transform"], b"private, max-age=0, No-Transform"),
        ([b"no-store,  must-revalidate ,"], b"no-store, must-revalidate, no-transform"),
    ],
)
async def test_cache_control_is_merged_never_weakened(given: list[bytes], sent: bytes) -> None:
    """The app's Cache-Control directives all stay, in one header (`no-store`: a completion
    the app marked as not to be stored is not made storable by a `no-cache` in its place);
    the guard adds `no-transform` where it is missing, and `no-cache` only where the app said
    nothing at all."""
    headers = SSE_HEADERS + [(b"cache-control", value) for value in given]
    response = await run(StreamGuard(scripted([(0, chunk("hi"))], headers=headers)))
    start = response[0]
    assert [v for n, v in start["headers"] if n == b"cache-control"] == [sent]
