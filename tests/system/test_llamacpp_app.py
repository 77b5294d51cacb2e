"""llama-cpp-python's own app (`llama_cpp.server.app.create_app`, FastAPI with CORS open to
every origin) wrapped by `StreamGuard` with telemetry on, served by uvicorn in a child
process, driven by the official openai SDK: each request is reported as what it was.

The model is the tiny one the other llama.cpp tests write (`tests.support.tinymodel`, greedy
decoding never ends before `max_tokens`). The child writes its access lines to stdout, its
spans over OTLP/HTTP to a receiver here, and its Prometheus text to a file when it exits
(SIGTERM), so every figure read is the one the guard computed. It runs in a child because
llama.cpp in this process would stay loaded (and `llama_cpp` holds files open) for the rest
of the run.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.clients import request
from tests.support.llamacpp import ALIAS, Process, require_llama_cpp
from tests.support.otlpreceiver import Receiver, attributes
from tests.support.procs import free_port
from tests.support.servers import serve
from tests.support.tinymodel import write_model

CHAT = "/v1/chat/completions"
MAX_TOKENS = 8
# The child: the app as its users build it, with sidestream's middleware and telemetry.
CHILD = """
import signal
import sys

import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import Settings

from middleware import StreamGuard
from middleware.telemetry import Telemetry, configure_access_log

model, port, metrics = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = Settings(
    model=model, model_alias="tiny", n_ctx=512, n_threads=1, n_threads_batch=1, seed=0,
    interrupt_requests=False, verbose=False,
)
telemetry = Telemetry.from_env()
configure_access_log()
app = StreamGuard(create_app(settings=settings), telemetry=telemetry)
# uvicorn shuts down on SIGTERM, then raises it again for the handler it found at start:
# this one lets the child go on to write its metrics.
signal.signal(signal.SIGTERM, lambda *_: None)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
with open(metrics, "wb") as out:
    out.write(telemetry.prometheus_text(app.registry))
telemetry.shutdown()
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once for the module (seed 0)."""
    require_llama_cpp()
    return write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=0)


async def listening(child: Process, port: int, timeout: float = 60.0) -> None:
    """Wait until the child's port accepts a connection: `create_app` loads the model before
    uvicorn binds, so then it is ready (no HTTP request: it would be one more span)."""
    deadline = time.monotonic() + timeout
    while True:
        assert child.alive(), f"the app exited:\n{child.output()[-3000:]}"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, f"the app never listened:\n{child.output()[-3000:]}"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The Prometheus text's samples of `name`: (labels, value)."""
    found = []
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name or head.startswith(name + "{"):
            found.append((dict(re.findall(r'(\w+)="([^"]*)"', head)), float(value)))
    return found


async def drive(port: int) -> tuple[int, list[str], Any, bytes, list[str]]:
    """A CORS preflight, a model listing, a non-streaming chat and a streaming chat, by the
    SDK (the preflight by hand: a browser sends it, not the SDK). Returns the preflight's
    status, the model ids, the call's usage and raw body, and the stream's contents."""
    preflight = await request(
        port,
        "OPTIONS",
        CHAT,
        headers=[
            ("Origin", "http://app.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type,authorization"),
        ],
    )
    preflight.close()
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-none", max_retries=0, timeout=60
    )
    messages: Any = [{"role": "user", "content": "hello"}]
    try:
        listed = [m.id async for m in client.models.list()]
        raw = await client.chat.completions.with_raw_response.create(
            model=ALIAS, messages=messages, max_tokens=MAX_TOKENS, temperature=0, seed=0
        )
        completion = raw.parse()
        stream = await client.chat.completions.create(
            model=ALIAS,
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=0,
            seed=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas = [c.choices[0].delta.content async for c in stream if c.choices]
        texts = [text for text in deltas if text]
    finally:
        await client.close()
    return preflight.status, listed, completion.usage, raw.http_response.content, texts


async def test_llama_cpp_pythons_app_is_reported_as_what_each_request_was(
    model: Path, tmp_path: Path
) -> None:
    """Rule: behind the guard, llama-cpp-python's app answers a CORS preflight, a model
    listing, a non-streaming and a streaming chat as it would alone; telemetry counts one
    stream (`sidestream_streams_total`), two chat operations, and the preflight and the
    listing nowhere but in their own spans (named by their method, no `gen_ai.*`); the
    non-streaming call's access line and span carry the usage its body reported, its bytes,
    and null for a stream's fields."""
    require_llama_cpp()
    receiver = Receiver()
    async with serve(receiver) as otlp:
        port, metrics = free_port(), tmp_path / "metrics.txt"
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{otlp}/v1/traces",
            "OTEL_METRICS_EXPORTER": "none",
        }
        args = [sys.executable, "-c", CHILD, str(model), str(port), str(metrics)]
        child = Process(args, tmp_path / "app.log", env)
        try:
            await listening(child, port)
            preflight, listed, usage, body, texts = await drive(port)
            child.signal(signal.SIGTERM)  # its exit writes the metrics and flushes the spans
            assert await child.exit_code(timeout=20) == 0, child.output()[-3000:]
        finally:
            child.kill()
    assert preflight == 200 and listed == [ALIAS]
    assert usage.completion_tokens == MAX_TOKENS and usage.prompt_tokens > 0
    assert len(texts) == MAX_TOKENS

    text = metrics.read_text()
    assert samples(text, "sidestream_streams_total") == [({"sidestream_outcome": "completed"}, 1)]
    durations = samples(text, "gen_ai_client_operation_duration_seconds_count")
    assert [(labels["gen_ai_operation_name"], n) for labels, n in durations] == [("chat", 2)]
    ttfc = samples(text, "gen_ai_client_operation_time_to_first_chunk_seconds_count")
    assert [n for _, n in ttfc] == [1]
    assert samples(text, "sidestream_active_streams") == [({}, 0)]

    lines = [json.loads(x) for x in child.output().splitlines() if x.startswith('{"time"')]
    assert [(line["path"], line["stream"]) for line in lines] == [(CHAT, False), (CHAT, True)]
    call, streamed = lines
    assert (call["input_tokens"], call["output_tokens"]) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert call["usage_source"] == "reported" and call["bytes"] == len(body)
    assert call["model"] == ALIAS and call["status"] == 200 and call["outcome"] == "completed"
    for key in ("tokens", "chunks", "keepalives", "ttft_ms"):
        assert call[key] is None, key
    assert streamed["outcome"] == "completed" and streamed["output_tokens"] == MAX_TOKENS
    assert streamed["tokens"] == MAX_TOKENS and streamed["chunks"] >= MAX_TOKENS

    spans = {(s.name, attributes(s)["http.request.method"]): attributes(s) for s in receiver.spans}
    assert sorted(spans) == [("GET", "GET"), ("OPTIONS", "OPTIONS"), (f"chat {ALIAS}", "POST")]
    assert len(receiver.spans) == 4  # the two chats share a name
    for (name, _), attrs in spans.items():
        assert any(k.startswith("gen_ai.") for k in attrs) == name.startswith("chat"), name
    calls = [attributes(s) for s in receiver.spans if not attributes(s).get("sidestream.chunks")]
    (call_span,) = [a for a in calls if a["http.request.method"] == "POST"]
    assert call_span["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert call_span["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert call_span["gen_ai.response.finish_reasons"] == ["length"]
