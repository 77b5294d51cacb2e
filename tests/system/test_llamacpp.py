"""A real inference server behind sidestream: llama.cpp's, through llama-cpp-python's server.

Each test writes nothing to the network but 127.0.0.1: a tiny llama-architecture GGUF model
with random weights is written by `tests.support.tinymodel` (nothing is downloaded), served
by `python -m llama_cpp.server` on one thread, with `python -m sidecar` in front. The output
is gibberish; the tokenizer, prefill, sampling, slot and SSE framing are llama.cpp's and
llama-cpp-python's own. Greedy decoding (temperature 0) never picks end-of-sequence with
this model, so a stream runs to `max_tokens` and ends with `finish_reason` "length".

Without llama-cpp-python installed these tests fail (`require_llama_cpp`): `make test-deps`
installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.clients import RawResponse, connection, read_response, request
from tests.support.llamacpp import (
    ALIAS,
    HEALTH_PATH,
    LlamaServer,
    Sidecar,
    chat_body,
    get,
    require_llama_cpp,
)
from tests.support.otlpreceiver import Receiver, attributes
from tests.support.procs import later_port
from tests.support.servers import serve
from tests.support.sseparse import parse
from tests.support.tinymodel import write_model

CHAT = "/v1/chat/completions"
JSON = [("Content-Type", "application/json")]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once for the module (seed 0)."""
    require_llama_cpp()
    return write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=0)


@contextlib.asynccontextmanager
async def running(
    model: Path,
    logs: Path,
    *flags: str,
    n_ctx: int = 512,
    health: str = HEALTH_PATH,
    env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[LlamaServer, Sidecar]]:
    """llama.cpp's server and the sidecar in front of it, both ready; both killed at exit."""
    llama = LlamaServer(model, logs / "llama.log", n_ctx=n_ctx)
    sidecar = Sidecar(llama.port, logs / "sidecar.log", *flags, health=health, env=env)
    try:
        await asyncio.gather(llama.ready(), sidecar.ready())
        yield llama, sidecar
    finally:
        sidecar.kill()
        llama.kill()


async def sdk_stream(port: int, content: str, max_tokens: int) -> tuple[list[str], list[Any]]:
    """Content deltas and finish reasons read by the official openai SDK."""
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-none", max_retries=0, timeout=60
    )
    texts: list[str] = []
    reasons: list[Any] = []
    try:
        stream = await client.chat.completions.create(
            model=ALIAS,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            temperature=0,
            seed=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    texts.append(choice.delta.content)
                if choice.finish_reason:
                    reasons.append(choice.finish_reason)
    finally:
        await client.close()
    return texts, reasons


async def post_stream(port: int, body: dict[str, Any]) -> RawResponse:
    return await request(port, "POST", CHAT, body=json.dumps(body).encode(), headers=JSON)


def content_of(event_data: str) -> str | None:
    if event_data == "[DONE]":
        return None
    choices = json.loads(event_data).get("choices") or [{}]
    return choices[0].get("delta", {}).get("content") or None


async def content_chunk_times(response: RawResponse) -> tuple[list[float], list[str]]:
    """Arrival time of each HTTP chunk that completes a content event, and the contents."""
    times: list[float] = []
    texts: list[str] = []
    pending = b""
    while (data := await response.chunk()) is not None:
        pending += data
        complete, _, pending = pending.rpartition(b"\n\n")
        found = [c for _, d, _ in parse(complete + b"\n\n") if (c := content_of(d))]
        if found:
            times.append(response.arrivals[-1][0])
            texts.extend(found)
    return times, texts


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_llama_cpp_python_is_installed() -> None:
    """llama-cpp-python's server is importable here (`make test-deps` installs it): the tests
    below never skip for want of it."""
    require_llama_cpp()


# --- streaming ---------------------------------------------------------------------------------


async def test_the_sdk_through_sidestream_gets_the_tokens_of_a_direct_request(
    model: Path, tmp_path: Path
) -> None:
    """Greedy decoding (temperature 0, seed 0): the openai SDK through sidestream reads the
    same tokens, in the same order, as the SDK talking to llama.cpp directly, and the same
    finish reason. The access line names llama.cpp's model and counts its tokens; the span
    carries llama.cpp's finish reason and model (the access line has no finish reason)."""
    receiver = Receiver()
    async with serve(receiver) as otlp:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{otlp}/v1/traces"}
        async with running(model, tmp_path, env=env) as (llama, sidecar):
            direct, direct_reasons = await sdk_stream(llama.port, "tell me", 40)
            proxied, proxied_reasons = await sdk_stream(sidecar.port, "tell me", 40)
            line = await sidecar.access_line()
            sidecar.signal(signal.SIGTERM)  # the exit flushes the span
            assert await sidecar.exit_code(timeout=10) == 0
    assert len(direct) == 40 and len(set(direct)) > 3  # real (if gibberish) generation
    assert proxied == direct
    assert direct_reasons == proxied_reasons == ["length"]
    assert line["model"] == ALIAS and line["path"] == CHAT
    assert line["outcome"] == "completed" and line["status"] == 200
    assert line["output_tokens"] == 40 and line["tokens"] == 40
    [span] = [attributes(s) for s in receiver.spans]
    assert span["gen_ai.response.finish_reasons"] == ["length"]
    assert span["gen_ai.response.model"] == ALIAS
    assert span["gen_ai.usage.output_tokens"] == 40


async def test_a_client_that_did_not_ask_for_usage_reads_llama_cpps_own_bytes(
    model: Path, tmp_path: Path
) -> None:
    """Under the default `--usage force` (usage asked of llama.cpp for the span), a raw
    client that did not ask reads through sidestream the bytes llama.cpp sends it directly,
    its per-request id and timestamp aside (greedy decoding: the same tokens); the access
    line counts llama.cpp's tokens."""
    async with running(model, tmp_path) as (llama, sidecar):
        bodies = []
        for port in (llama.port, sidecar.port):
            response = await post_stream(port, chat_body("tell me", 12))
            bodies.append(await asyncio.wait_for(response.body(), 60))
            response.close()
        line = await sidecar.access_line()
    direct, proxied = (
        re.sub(rb'"created":\s*\d+', b"", re.sub(rb'"id":\s*"[^"]*"', b"", body)) for body in bodies
    )
    assert direct.count(b"data: ") >= 12 and proxied == direct
    assert line["output_tokens"] == 12 and line["outcome"] == "completed"


async def test_access_line_ttft_and_gaps_agree_with_a_raw_client(
    model: Path, tmp_path: Path
) -> None:
    """The access line's time to first token and inter-token gaps (median, mean) are within
    2 ms of what a raw socket client measures on an open connection: from writing the request
    to reading the first content chunk, and between content chunks as they arrive. (One
    stream first, so neither side's first-use costs land in the measured one.)"""
    async with running(model, tmp_path) as (_, sidecar):
        await sdk_stream(sidecar.port, "warm up", 4)
        async with connection(sidecar.port) as (reader, writer):
            body = json.dumps(chat_body("time me", 100)).encode()
            head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            started = time.monotonic()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            response = await read_response(reader, writer)
            times, texts = await content_chunk_times(response)
            response.close()
        line = await sidecar.access_line(2)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    client = {
        "ttft_ms": (times[0] - started) * 1000,
        "itl_p50_ms": nearest_rank(gaps, 0.5) * 1000,
        "itl_mean_ms": (times[-1] - times[0]) / len(gaps) * 1000,
        "itl_max_ms": max(gaps) * 1000,
    }
    reported = {key: line.get(key) for key in client}
    reported["itl_mean_ms"] = 1000 / line["tokens_per_s"]
    assert len(texts) == 100 and line["chunks"] >= len(times)
    print(f"client {client}, access line {reported}")
    for key in ("ttft_ms", "itl_p50_ms", "itl_mean_ms"):
        assert abs(reported[key] - client[key]) <= 2.0, (key, reported[key], client[key])
    # One gap alone: a scheduling hiccup on either side moves it, so the bound is looser.
    assert abs(reported["itl_max_ms"] - client["itl_max_ms"]) <= 5.0, reported


# --- cancellation ------------------------------------------------------------------------------


async def first_tokens(response: RawResponse, count: int) -> tuple[bytes, float]:
    """Read until `count` content chunks have come; the body so far and seconds a token."""
    raw = b""
    times: list[float] = []
    while len(times) < count:
        data = await response.chunk()
        assert data is not None, raw
        raw += data
        if b'"content"' in data:
            times.append(time.monotonic())
    return raw, (times[-1] - times[1]) / (count - 2)


async def get_completion(port: int, max_tokens: int) -> tuple[int, bytes]:
    """A non-streamed request: it needs the server's one slot."""
    body = chat_body("next", max_tokens, stream=False)
    response = await request(port, "POST", CHAT, body=json.dumps(body).encode(), headers=JSON)
    try:
        return response.status, await response.body()
    finally:
        response.close()


MAX_TOKENS = 1500  # uninterrupted, a stream holds the slot for seconds
READ = 20


async def test_a_client_that_leaves_mid_stream_stops_llama_cpp(model: Path, tmp_path: Path) -> None:
    """A client that closes mid-stream through sidestream makes llama.cpp stop generating:
    the server logs the disconnect, and a next request, which needs the one slot, is served
    long before the abandoned generation would have ended."""
    async with running(model, tmp_path, n_ctx=2048) as (llama, sidecar):
        response = await post_stream(sidecar.port, chat_body("go on", MAX_TOKENS))
        _, per_token = await first_tokens(response, READ)
        response.close()
        left = time.monotonic()
        await llama.wait_output("Disconnected from client", timeout=10)
        status, body = await asyncio.wait_for(get_completion(llama.port, 1), timeout=30)
        next_served = time.monotonic() - left
        line = await sidecar.access_line()
    rest = (MAX_TOKENS - READ) * per_token
    print(
        f"next request served {next_served * 1000:.0f} ms after the close; uncancelled {rest:.2f} s"
    )
    assert status == 200, body
    assert line["outcome"] == "client_disconnected"
    assert next_served < 0.25 * rest


async def test_delete_of_a_resumable_stream_stops_llama_cpp(model: Path, tmp_path: Path) -> None:
    """With resume on, a reader leaving does not stop generation (the grace period), but
    `DELETE /sidestream/v1/streams/<id>` does, at once: llama.cpp logs the disconnect and a
    next request, which needs the one slot, is served long before the stream would have
    ended; the reader gets a terminal `cancelled` event."""
    async with running(model, tmp_path, "--resume", n_ctx=2048) as (llama, sidecar):
        response = await post_stream(sidecar.port, chat_body("go on", MAX_TOKENS))
        stream_id = response.header("sidestream-stream-id")
        assert stream_id, response.headers
        _, per_token = await first_tokens(response, READ)
        stop = await request(sidecar.port, "DELETE", f"/sidestream/v1/streams/{stream_id}")
        stopped = time.monotonic()
        assert stop.status == 204
        stop.close()
        rest_of_reader = await asyncio.wait_for(response.body(), 10)
        response.close()
        await llama.wait_output("Disconnected from client", timeout=10)
        status, body = await asyncio.wait_for(get_completion(llama.port, 1), timeout=30)
        next_served = time.monotonic() - stopped
    rest = (MAX_TOKENS - READ) * per_token
    print(f"next request served {next_served * 1000:.0f} ms after DELETE; uncancelled {rest:.2f} s")
    assert b"cancelled" in rest_of_reader
    assert status == 200, body
    assert next_served < 0.25 * rest


async def test_an_idle_timeout_on_a_stalled_server_frees_its_slot(
    model: Path, tmp_path: Path
) -> None:
    """llama.cpp stalls mid-stream (its process stopped, as a hung device would leave it):
    the sidecar's idle timeout ends the client's stream with a terminal `idle_timeout` event
    and closes the upstream connection; once the server runs again it sees the disconnect
    and stops generating, so the next request gets the slot long before the stream would
    have ended."""
    async with running(model, tmp_path, "--idle-timeout", "0.5", n_ctx=2048) as (llama, sidecar):
        response = await post_stream(sidecar.port, chat_body("stall", MAX_TOKENS))
        raw, per_token = await first_tokens(response, READ)
        llama.signal(signal.SIGSTOP)
        try:
            stalled = time.monotonic()
            raw += await asyncio.wait_for(response.body(), timeout=5)
            ended_after = time.monotonic() - stalled
        finally:
            llama.signal(signal.SIGCONT)
        resumed = time.monotonic()
        response.close()
        await llama.wait_output("Disconnected from client", timeout=10)
        status, _ = await asyncio.wait_for(get_completion(llama.port, 1), timeout=30)
        next_served = time.monotonic() - resumed
        line = await sidecar.access_line()
    rest = (MAX_TOKENS - READ) * per_token
    print(
        f"stream ended {ended_after:.2f} s into the stall; next request {next_served * 1000:.0f} ms"
    )
    last = json.loads(parse(raw)[-1][1])
    assert last["error"]["code"] == "idle_timeout"
    assert 0.4 < ended_after < 2.0
    assert status == 200 and line["outcome"] == "idle_timeout"
    assert next_served < 0.25 * rest


# --- long prefill ------------------------------------------------------------------------------


async def test_a_long_prefill_gets_keepalives_and_the_sdk_completes(
    model: Path, tmp_path: Path
) -> None:
    """A prompt that keeps llama.cpp silent for several keep-alive intervals (prefill on one
    thread): the sidecar writes `: keep-alive` comments meanwhile, and the openai SDK reads
    the stream to its normal end."""
    prompt = "a b " * 900  # ~3600 prompt tokens: one character a token
    async with running(model, tmp_path, "--keepalive-interval", "0.2", n_ctx=4096) as (_, sidecar):
        texts, reasons = await sdk_stream(sidecar.port, prompt, 8)
        line = await sidecar.access_line()
    print(f"prefill: ttft {line['ttft_ms']:.0f} ms, {line['keepalives']} keep-alives")
    assert len(texts) == 8 and reasons == ["length"]
    assert line["outcome"] == "completed"
    assert line["ttft_ms"] > 3 * 200, line  # the prefill really was that long
    assert line["keepalives"] >= 2, line


# --- health and drain --------------------------------------------------------------------------


async def test_readyz_follows_llama_cpp_loading_and_death(model: Path, tmp_path: Path) -> None:
    """/readyz (health path /openapi.json: llama-cpp-python has no /health) is 503 until
    llama.cpp has loaded its model and opened its port, 200 after; killing the server makes
    it 503 within 2 s, and a new request gets 502."""
    port = later_port()  # llama.cpp binds it once its model is loaded, seconds later
    sidecar = Sidecar(port, tmp_path / "sidecar.log")
    llama: LlamaServer | None = None
    try:
        await sidecar.ready()
        assert (await get(sidecar.admin, "/readyz"))[0] == 503
        llama = LlamaServer(model, tmp_path / "llama.log", port=port)
        samples: list[tuple[int, bool]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            loaded = "Uvicorn running on" in llama.output()
            status, _ = await get(sidecar.admin, "/readyz")
            samples.append((status, loaded))
            if status == 200:
                break
            await asyncio.sleep(0.05)
        assert samples[-1] == (200, True)
        assert all(status == 503 for status, _ in samples[:-1])
        assert any(not loaded for _, loaded in samples)  # it was seen loading
        llama.kill()
        killed = time.monotonic()
        while (await get(sidecar.admin, "/readyz"))[0] != 503:
            assert time.monotonic() - killed < 2.0, "still ready 2 s after the server died"
            await asyncio.sleep(0.05)
        print(f"not ready {(time.monotonic() - killed) * 1000:.0f} ms after the kill")
        response = await post_stream(sidecar.port, chat_body("anyone?", 4))
        body = await response.body()
        response.close()
    finally:
        sidecar.kill()
        if llama is not None:
            llama.kill()
    assert response.status == 502
    assert json.loads(body)["error"]["code"] == "upstream_unreachable"


@pytest.mark.parametrize(
    ("health", "ready_throughout"), [("/openapi.json", True), ("/v1/models", False)]
)
async def test_readyz_during_a_long_stream_depends_on_the_health_path(
    model: Path, tmp_path: Path, health: str, ready_throughout: bool
) -> None:
    """The recipe's health path, /openapi.json, is served without llama-cpp-python's model
    lock: /readyz stays 200 through a stream of several seconds. /v1/models (the control)
    waits for the lock, so the probe times out and the pod would turn not ready whenever it
    streams; with `--interrupt_requests false` neither probe cuts the stream short."""
    async with running(model, tmp_path, n_ctx=2048, health=health) as (_, sidecar):
        started = time.monotonic()
        stream = asyncio.ensure_future(sdk_stream(sidecar.port, "busy", 1800))
        statuses = []
        while not stream.done():
            statuses.append((await get(sidecar.admin, "/readyz"))[0])
            await asyncio.sleep(0.25)
        texts, reasons = await stream
        lasted = time.monotonic() - started
    assert len(texts) == 1800 and reasons == ["length"]
    print(f"{health}: /readyz during a {lasted:.1f} s stream: {statuses}")
    assert lasted > 2.5 and len(statuses) >= 3  # long enough for a probe to wait it out
    assert (set(statuses) == {200}) is ready_throughout, statuses


async def test_sigterm_drains_a_llama_cpp_stream_to_completion(model: Path, tmp_path: Path) -> None:
    """SIGTERM to the sidecar mid-stream: readiness drops, and the stream llama.cpp is
    generating runs to its end ([DONE], finish reason "length") before the sidecar exits 0."""
    async with running(model, tmp_path, "--drain-timeout", "30", n_ctx=2048) as (_, sidecar):
        response = await post_stream(sidecar.port, chat_body("drain", 300))
        raw = b""
        while raw.count(b'"content"') < 10:
            data = await response.chunk()
            assert data is not None
            raw += data
        sidecar.signal(signal.SIGTERM)
        for _ in range(100):
            if (await get(sidecar.admin, "/readyz"))[0] == 503:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("still ready 2 s after SIGTERM")
        raw += await asyncio.wait_for(response.body(), timeout=30)
        response.close()
        code = await sidecar.exit_code(timeout=10)
    events = parse(raw)
    assert events[-1][1] == "[DONE]"
    assert json.loads(events[-2][1])["choices"][0]["finish_reason"] == "length"
    assert sum(1 for _, d, _ in events if content_of(d)) == 300
    assert code == 0
