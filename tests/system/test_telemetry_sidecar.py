"""Telemetry in the sidecar process: admin /metrics serves the GenAI metrics, stdout carries
one JSON access-log line per stream, and OTEL_SDK_DISABLED=true turns it all off."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import free_port
from tests.support.servers import serve

BODY = json.dumps(
    {
        "model": "m1",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "sidestream": {"tokens": 5, "ttft_ms": 0, "itl_ms": 1},
    }
).encode()


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def spawn(upstream: int, port: int, admin: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.Popen(
        [
            sys.executable, "-m", "sidecar",
            "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin}",
            "--upstream", f"http://127.0.0.1:{upstream}",
            "--log-level", "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**clean, **env},
    )  # fmt: skip


async def start(upstream: int, **env: str) -> tuple[subprocess.Popen[bytes], int, int]:
    port, admin = free_port(), free_port()
    process = spawn(upstream, port, admin, env)
    for _ in range(400):
        assert process.poll() is None
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", admin)
        except OSError:
            await asyncio.sleep(0.025)
            continue
        writer.close()
        return process, port, admin
    process.kill()
    raise TimeoutError("the sidecar did not start")


async def one_stream_then_metrics(port: int, admin: int) -> str:
    response = await request(port, "POST", "/v1/chat/completions", body=BODY)
    try:
        await response.body()
    finally:
        response.close()
    await asyncio.sleep(0.1)
    metrics = await request(admin, "GET", "/metrics")
    try:
        text = (await metrics.body()).decode()
    finally:
        metrics.close()
    return text


async def stop(process: subprocess.Popen[bytes]) -> bytes:
    process.send_signal(signal.SIGTERM)
    out, _ = await asyncio.to_thread(process.communicate, timeout=20)
    return out


async def test_sidecar_serves_genai_metrics_and_logs_one_json_line(upstream: int) -> None:
    """With no OTEL_* set: /metrics has the GenAI histograms and stream counters after a
    stream, and stdout carries exactly one JSON access-log line for it."""
    process, port, admin = await start(upstream)
    try:
        text = await one_stream_then_metrics(port, admin)
    finally:
        out = await stop(process)
    assert "sidestream_active_streams 0" in text.splitlines()
    assert "gen_ai_client_operation_time_to_first_chunk_seconds_count{" in text
    assert 'sidestream_streams_total{sidestream_outcome="completed"} 1' in text
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert len(lines) == 1
    assert lines[0]["outcome"] == "completed" and lines[0]["tokens"] == 5


async def test_otel_sdk_disabled_leaves_only_the_active_streams_gauge(upstream: int) -> None:
    """OTEL_SDK_DISABLED=true: no GenAI metrics, no access log, the gauge still served."""
    process, port, admin = await start(upstream, OTEL_SDK_DISABLED="true")
    try:
        text = await one_stream_then_metrics(port, admin)
    finally:
        out = await stop(process)
    assert "sidestream_active_streams 0" in text.splitlines()
    assert "gen_ai_" not in text
    assert not [line for line in out.decode().splitlines() if line.startswith("{")]
