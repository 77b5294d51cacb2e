"""Broken upstreams, on real sockets: each client gets a well-formed end, the others stream on.

The sidecar (what `python -m sidecar` builds) runs in the test's loop in front of
`tests.support.faulty.FaultyUpstream`; each faulty request runs beside a healthy stream through the
same sidecar and upstream, which must finish with every token and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from middleware.errors import Outcome
from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from tests.support.clients import RawResponse, request
from tests.support.faulty import (
    BAD_UTF8_BODY,
    ERROR_BODIES,
    HUGE_LINE_BYTES,
    FaultyUpstream,
    record_outcomes,
)
from tests.support.servers import serve
from tests.support.sseparse import parse

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def sidecar_app(upstream: int, *flags: str) -> Any:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}", *flags], environ={})
    return build_guard(settings, StreamRegistry())


@pytest.fixture
def outcomes() -> Iterator[list[Outcome]]:
    with record_outcomes() as recorded:
        yield recorded


async def send(port: int, fault: str, **pacing: int) -> RawResponse:
    headers = [("Content-Type", "application/json"), ("X-Fault", fault)]
    headers += [(f"X-Fault-{k.replace('_', '-')}", str(v)) for k, v in pacing.items()]
    return await request(port, "POST", CHAT, body=BODY, headers=headers)


async def fetch(port: int, fault: str, **pacing: int) -> tuple[RawResponse, bytes]:
    """The whole response; `chunk()` raises if the chunked framing is not cleanly ended."""
    response = await send(port, fault, **pacing)
    body = await response.body()
    response.close()
    return response, body


async def break_beside_a_healthy_stream(fault: str) -> tuple[RawResponse, bytes, bytes, int]:
    """One request meets `fault` while a healthy 40-token stream runs beside it.

    Returns the broken response and body, the healthy body, and how many upstream
    connections were still busy afterwards.
    """
    async with (
        FaultyUpstream() as upstream,
        serve(sidecar_app(upstream.port, "--first-token-timeout", "0.5"), "sidecar") as port,
    ):
        healthy = asyncio.ensure_future(fetch(port, "ok", tokens=40, itl_ms=20))
        await asyncio.sleep(0.05)
        response, body = await fetch(port, fault)
        _, healthy_body = await healthy
        await asyncio.sleep(0.05)
        return response, body, healthy_body, upstream.busy


def assert_healthy(body: bytes, tokens: int) -> None:
    events = [data for _, data, _ in parse(body)]
    assert events[-1] == "[DONE]" and len(events) == tokens + 1


def error_code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("fin", "upstream_protocol_error"),
        ("rst", "upstream_protocol_error"),
        ("truncated", "upstream_protocol_error"),
        ("headers_only", "first_token_timeout"),
    ],
)
async def test_upstream_breaking_after_headers_ends_with_a_terminal_event(
    outcomes: list[Outcome], fault: str, code: str
) -> None:
    """After headers: a terminal SSE error event and a clean chunked end; the neighbour is unharmed."""
    response, body, healthy_body, busy = await break_beside_a_healthy_stream(fault)
    assert response.status == 200
    events = parse(body)
    assert error_code(events[-1][1].encode()) == code
    if fault != "headers_only":
        assert "one" in events[0][1]  # the tokens before the break were forwarded
    assert_healthy(healthy_body, 40)
    expected = Outcome.UPSTREAM_ERROR if fault != "headers_only" else Outcome.FIRST_TOKEN_TIMEOUT
    assert sorted(outcomes) == sorted([expected, Outcome.COMPLETED])
    assert busy == 0  # the upstream saw the abandoned answer's connection close


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [("invalid", 502, "upstream_protocol_error"), ("silent", 504, "first_token_timeout")],
)
async def test_upstream_breaking_before_headers_gets_a_json_error(
    outcomes: list[Outcome], fault: str, status: int, code: str
) -> None:
    """Before headers: a 502/504 with an OpenAI-style JSON error body; the neighbour is unharmed."""
    response, body, healthy_body, busy = await break_beside_a_healthy_stream(fault)
    assert response.status == status
    assert response.header("content-type") == "application/json"
    assert error_code(body) == code
    assert_healthy(healthy_body, 40)
    expected = Outcome.UPSTREAM_ERROR if status == 502 else Outcome.FIRST_TOKEN_TIMEOUT
    assert sorted(outcomes) == sorted([expected, Outcome.COMPLETED])
    assert busy == 0


@pytest.mark.parametrize("fault", ["500", "429"])
async def test_upstream_json_errors_pass_through_unchanged(
    outcomes: list[Outcome], fault: str
) -> None:
    """The upstream's own 500/429 JSON answers reach the client as they are, Retry-After kept,
    and count as what they are: a 5xx is `upstream_error`, a 429 `rate_limited` (not
    `completed`, or dashboards would show failures as successes)."""
    async with FaultyUpstream() as upstream, serve(sidecar_app(upstream.port), "sidecar") as port:
        response, body = await fetch(port, fault)
        again, _ = await fetch(port, "ok")
    assert response.status == int(fault) and body == ERROR_BODIES[fault]
    assert response.header("content-type") == "application/json"
    assert response.header("retry-after") == ("7" if fault == "429" else None)
    assert again.status == 200
    expected = Outcome.UPSTREAM_ERROR if fault == "500" else Outcome.RATE_LIMITED
    assert outcomes == [expected, Outcome.COMPLETED]


async def test_invalid_utf8_is_forwarded_byte_for_byte(outcomes: list[Outcome]) -> None:
    """Bytes that are not UTF-8 pass through unchanged: the guard scans bytes, never re-encodes."""
    async with FaultyUpstream() as upstream, serve(sidecar_app(upstream.port), "sidecar") as port:
        response, body = await fetch(port, "bad_utf8")
    assert response.status == 200 and body == BAD_UTF8_BODY
    assert outcomes == [Outcome.COMPLETED]


async def test_a_10mb_line_without_newline_is_forwarded_in_bounded_memory(
    outcomes: list[Outcome],
) -> None:
    """A 10 MB `data:` line is forwarded as it comes; the sidecar never holds the whole line.

    The relay is pull-based and the SSE scanner keeps at most 1 MiB of an unfinished line
    (for telemetry only; cutting it briefly copies that MiB twice), so the whole process —
    sidecar, upstream and client — peaks well below the line's size.
    """
    async with FaultyUpstream() as upstream, serve(sidecar_app(upstream.port), "sidecar") as port:
        tracemalloc.start()
        try:
            response = await send(port, "huge_line")
            received, tail = 0, b""
            while (data := await response.chunk()) is not None:
                received += len(data)
                response.arrivals.clear()  # the raw client keeps every chunk otherwise
                tail = (tail + data)[-200:]
            response.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert response.status == 200
    assert received > HUGE_LINE_BYTES and tail.endswith(b"data: [DONE]\n\n")
    assert peak < 6 * 1024 * 1024, f"peak traced memory {peak / 1e6:.1f} MB"
    assert outcomes == [Outcome.COMPLETED]
