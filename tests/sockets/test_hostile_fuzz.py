"""Fuzz the sidecar's request path and the guard's SSE handling with hypothesis, for a bounded time.

The request-path fuzz sends generated HTTP/1.1 requests (odd methods, targets, header bytes
including CR, LF and NUL, framing headers in any combination, bodies) over real sockets to
the sidecar, which runs with the traffic listener's protocol in a thread of its own. Every
request must get a status line from a small set, or a close, within seconds; the upstream
must never see ambiguous framing or a control byte in a header; the sidecar keeps serving.
The SSE fuzz feeds arbitrary upstream bytes, split anywhere, through StreamGuard: the client
gets exactly those bytes back, whatever they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from middleware.types import Message, Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.servers.http1 import protocol_class
from tests.support.servers import serve
from tests.support.upstreams import EchoUpstream

ALLOWED = {200, 400, 405, 408, 413, 431, 501, 505}


@pytest.fixture(scope="module")
def sidecar() -> Iterator[tuple[int, EchoUpstream]]:
    """The sidecar and an echo upstream on a loop in a background thread; yields (port, upstream)."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        upstream = EchoUpstream()
        stop = asyncio.Event()
        box["stop"], box["loop"], box["upstream"] = stop, asyncio.get_running_loop(), upstream
        async with serve(upstream) as upstream_port:
            flags = ["--upstream", f"http://127.0.0.1:{upstream_port}"]
            flags += ["--max-body", "2000", "--max-header-bytes", "4096"]
            app = build_guard(load(flags, environ={}), StreamRegistry())
            async with serve(app, http=protocol_class(2.0, 4096 + 8192)) as port:
                box["port"] = port
                ready.set()
                await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield box["port"], box["upstream"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(10)


def exchange(port: int, raw: bytes, timeout: float = 5.0) -> bytes | None:
    """The server's bytes until it closes; None when it is still silent after `timeout`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(raw)
        parts = []
        try:
            while data := sock.recv(65536):
                parts.append(data)
        except TimeoutError:
            return b"".join(parts) or None
        except ConnectionError:
            pass
    return b"".join(parts)


def awaits_body(headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """The request declares more body than was sent: waiting for it is the server's job."""
    for name, value in headers:
        name = name.strip().lower()
        if name == b"transfer-encoding" or (name == b"expect" and b"100" in value):
            return True
        if name == b"content-length" and value.strip().isdigit() and int(value) > len(body):
            return True
    return False


token = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!#$%&'*+^`|~",
    min_size=1,
    max_size=12,
)
header_name = st.one_of(
    st.sampled_from(
        [
            "Host",
            "Content-Length",
            "Transfer-Encoding",
            "Connection",
            "Expect",
            "Upgrade",
            "Authorization",
        ]
    ),
    token,
    st.binary(min_size=1, max_size=8),
).map(lambda n: n if isinstance(n, bytes) else n.encode())
header_value = st.one_of(
    st.sampled_from(
        [
            b"chunked",
            b"5",
            b"0",
            b"-1",
            b"5, 6",
            b"chunked, gzip",
            b"100-continue",
            b"close",
            b"websocket",
        ]
    ),
    st.binary(max_size=24),
)
method = st.one_of(
    st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"CONNECT", b"TRACE", b"PATCH"]),
    st.binary(min_size=1, max_size=8),
)
target = st.one_of(
    st.sampled_from(
        [b"/v1/models", b"*", b"http://evil.example/x", b"evil.example:443", b"/a?b=c#d", b"//x"]
    ),
    st.binary(min_size=1, max_size=16),
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=method,
    target=target,
    version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 x", b""]),
    headers=st.lists(st.tuples(header_name, header_value), max_size=6),
    body=st.binary(max_size=64),
)
@example(  # found by CI: an interim 100 Continue precedes the answer
    method=b"GET",
    target=b"/v1/models",
    version=b"HTTP/1.1",
    headers=[(b"Expect", b"100-continue")],
    body=b"",
)
def test_any_request_gets_a_clear_answer_and_nothing_ambiguous_is_forwarded(
    sidecar: tuple[int, EchoUpstream],
    method: bytes,
    target: bytes,
    version: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    """Any generated request: a known status or a close, in seconds; the upstream never sees
    CL with TE, two CLs, or CR/LF/NUL in a header."""
    port, upstream = sidecar
    raw = method + b" " + target + b" " + version + b"\r\nHost: x\r\nConnection: close\r\n"
    raw += b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n" + body
    answer = exchange(port, raw, timeout=3.0)
    if answer is None:
        assert awaits_body(headers, body), raw  # silent only while a declared body is missing
    elif answer:
        # An interim `100 Continue` (the client sent `Expect: 100-continue` and the proxy read
        # the body) may come first; the final answer follows it.
        while answer.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in answer:
            answer = answer.split(b"\r\n\r\n", 1)[1]
        assert answer.startswith(b"HTTP/1.1 "), answer[:80]
        assert int(answer[9:12]) in ALLOWED, answer[:200]
    for seen in list(upstream.seen):
        names = [n for n, _ in seen.get("headers", [])]
        assert not ("content-length" in names and "transfer-encoding" in names)
        assert names.count("content-length") <= 1
        for n, v in seen.get("headers", []):
            assert not any(c in n + v for c in "\r\n\x00")
    upstream.seen.clear()
    alive = exchange(port, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert alive is not None and alive.startswith(b"HTTP/1.1 200")


def relay_app(chunks: list[bytes]) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


sse_bytes = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from(
            [
                b"\r",
                b"\n",
                b"\r\n",
                b"\xef\xbb\xbf",
                b"data:",
                b"id: 1\x00",
                b": c",
                b"\xff\xfe",
                b"data: [DONE]\n\n",
            ]
        ),
    ),
    max_size=30,
)


# Pieces of real LLM chunks too, so telemetry's dialects and its learned frame see
# near-valid JSON, tails, usage and cut events, not only noise.
llm_bytes = st.lists(
    st.one_of(
        sse_bytes.map(b"".join),
        st.sampled_from(
            [
                b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{'
                b'"index":0,"delta":{"content":"',
                b'data: {"choices":[{"text":"',
                b"x",
                b'\\"',
                b'"},"logprobs":null,"finish_reason":null}]}\n\n',
                b'"},"finish_reason":"stop"}],"usage":{"completion_tokens":2}}\n\n',
                b'"}}],"obfuscation":"q"}\n\n',
                b'event: content_block_delta\ndata: {"delta":{"text":"',
                b'data: {"token":{"text":"',
                b"}\n\n",
                b"data: [DONE]\n\n",
            ]
        ),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(chunks=llm_bytes, telemetry=st.booleans())
async def test_any_upstream_bytes_pass_through_the_guard_unchanged(
    chunks: list[bytes], telemetry: bool
) -> None:
    """Whatever bytes an upstream streams as SSE (broken UTF-8, lone CR, NUL, BOMs, pieces of
    LLM chunks in any order), the guard neither fails nor alters them, with telemetry (its
    dialects and token counting read every chunk) or without."""
    recorder = None
    if telemetry:
        exporter = InMemorySpanExporter()
        recorder = Telemetry(span_processor=SimpleSpanProcessor(exporter))
    guard = StreamGuard(relay_app(chunks), keepalive_interval=None, telemetry=recorder)
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    path = "/v1/chat/completions" if telemetry else "/v1/stream"
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode()}
    scope |= {"headers": [], "query_string": b"", "http_version": "1.1", "scheme": "http"}
    await guard(scope, receive, send)
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert sent[0]["status"] == 200 and out == b"".join(chunks)
    if recorder is not None:
        recorder.shutdown()
        (span,) = exporter.get_finished_spans()
        assert dict(span.attributes or {})[semconv.OUTCOME] == "completed"
