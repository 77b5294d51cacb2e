"""An `h2c://` upstream that speaks HTTP/1.1 only (the emulator, vLLM, most servers behind
uvicorn): every request gets a 502 that names the cause and what to use instead, the sidecar
logs it once, and `/readyz` is unready with the same words. An upstream that does speak h2c
(hypercorn) is served and ready, so the check does not refuse what works."""

from __future__ import annotations

import json
import logging

import pytest

from middleware.registry import StreamRegistry
from sidecar.admin import UpstreamHealth
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.upstream.types import Upstream
from tests.support.clients import request
from tests.support.servers import serve

BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def sidecar(upstream: str) -> object:
    settings = load(["--upstream", upstream, "--keepalive-interval", "off"], environ={})
    return build_guard(settings, StreamRegistry())


async def test_an_http1_upstream_behind_h2c_gets_a_502_that_names_the_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The README's old example (h2c:// in front of an HTTP/1.1 server): 502, a message that
    says the upstream answered HTTP/1.1 and to use http://, and one log line for many
    requests."""
    async with (
        serve(make_app(stats=Stats())) as upstream,
        serve(sidecar(f"h2c://127.0.0.1:{upstream}")) as port,
    ):
        with caplog.at_level(logging.ERROR, "sidestream"):
            for _ in range(3):
                response = await request(port, "POST", "/v1/chat/completions", body=BODY)
                body = await response.body()
                response.close()
                assert response.status == 502
                message = json.loads(body)["error"]["message"]
                assert "HTTP/1.1" in message and "http://" in message, message
    told = [r for r in caplog.records if "prior-knowledge" in r.getMessage()]
    assert len(told) == 1


async def test_readyz_says_an_http1_upstream_does_not_speak_h2c() -> None:
    """`/readyz` asks the upstream with the traffic's protocol: unready, with the cause."""
    async with serve(make_app(stats=Stats())) as upstream:
        health = UpstreamHealth(Upstream.parse(f"h2c://127.0.0.1:{upstream}"), "/health")
        try:
            healthy, detail = await health.check()
        finally:
            await health.aclose()
    assert not healthy and "answered HTTP/1.1" in detail, detail


async def test_an_upstream_that_speaks_h2c_is_served_and_ready() -> None:
    """hypercorn speaks h2c with prior knowledge: streams are served, `/readyz` is ready."""
    async with serve(make_app(stats=Stats()), server="hypercorn") as upstream:
        health = UpstreamHealth(Upstream.parse(f"h2c://127.0.0.1:{upstream}"), "/health")
        try:
            assert (await health.check())[0]
        finally:
            await health.aclose()
        async with serve(sidecar(f"h2c://127.0.0.1:{upstream}")) as port:
            response = await request(port, "POST", "/v1/chat/completions", body=BODY)
            body = await response.body()
            response.close()
    assert response.status == 200 and b"[DONE]" in body
