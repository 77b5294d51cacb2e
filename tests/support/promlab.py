"""A real Prometheus for tests: Debian's `prometheus` on a free 127.0.0.1 port, scraping the
given targets every second, with its HTTP API for queries; and an upstream that adds the
faults the emulator never makes (a 500, a 429, a flood for a client that reads nothing).

Used by tests/system/test_prometheus.py and tests/support/render_dashboard.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from middleware.types import Receive, Scope, Send
from sidecar.emulator import Emulator
from tests.support.clients import RawResponse, request
from tests.support.procs import free_port
from tests.support.tools import tool

SCRAPE_INTERVAL = "1s"
FAULT_HEADER = b"x-test-fault"
LABELS = {"pod": "sidestream-test", "namespace": "test"}


class FaultyEmulator:
    """The emulator, except for requests with `X-Test-Fault`: `500` and `429` answer that
    status (OpenAI-shaped), `flood` streams 64 KiB events as fast as the client takes them."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fault = None
        if scope["type"] == "http":
            fault = dict(scope["headers"]).get(FAULT_HEADER)
        if fault is None:
            await self.emulator(scope, receive, send)
            return
        while (await receive()).get("more_body", False):
            pass
        if fault == b"flood":
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            piece = b"data: " + b"y" * 65530 + b"\n\n"
            for _ in range(4000):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        status = int(fault)
        body = json.dumps({"error": {"message": "injected", "type": "test", "code": status}})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})


class Prometheus:
    """A `prometheus` process and its HTTP API."""

    def __init__(self, port: int, process: asyncio.subprocess.Process, workdir: Path) -> None:
        self.port = port
        self.process = process
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    async def api(self, path: str, **params: str) -> Any:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(f"{self.url}/api/v1/{path}", params=params)
        payload = response.json()
        assert payload["status"] == "success", payload
        return payload["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` gives now (an error is an AssertionError)."""
        data = await self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    async def query_range(self, promql: str, start: float, end: float, step: str) -> Any:
        data = await self.api(
            "query_range", query=promql, start=str(start), end=str(end), step=step
        )
        return data["result"]

    async def scrapes(self) -> int:
        """How many scrapes of sidestream's admin /metrics have succeeded (`up` samples)."""
        found = await self.query(f'count_over_time(up{{pod="{LABELS["pod"]}"}}[1h])')
        return int(float(found[0]["value"][1])) if found else 0


def write_config(
    workdir: Path, targets: list[str], rule_files: list[Path], interval: str = SCRAPE_INTERVAL
) -> Path:
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "sidestream",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets, "labels": LABELS}],
            }
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def prometheus(targets: list[str], rule_files: list[Path]) -> AsyncIterator[Prometheus]:
    """Run `prometheus` scraping `targets` (HOST:PORT) every second; stop it on exit."""
    binary = tool("prometheus")
    with tempfile.TemporaryDirectory(prefix="sidestream-prometheus-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir, targets, rule_files)
        port = free_port()
        log = (workdir / "prometheus.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
        server = Prometheus(port, process, workdir)
        try:
            await _ready(server)
            yield server
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            log.close()


async def _ready(server: Prometheus) -> None:
    async with httpx.AsyncClient(timeout=1) as http:
        for _ in range(300):
            assert server.process.returncode is None, server.log()
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{server.url}/-/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError("prometheus did not become ready in 30 s")


# -- traffic of every outcome ---------------------------------------------------------------

CHAT = "/v1/chat/completions"
# Short limits, so that each outcome happens in a second or two.
SIDECAR_FLAGS = (
    "--keepalive-interval", "0.3",
    "--first-token-timeout", "0.8",
    "--idle-timeout", "1.2",
    "--max-duration", "2.5",
    "--send-timeout", "0.5",
    "--max-streams", "6",
    "--drain-timeout", "2",
)  # fmt: skip
MODELS = ("llama-3-8b", "qwen2-7b")


def chat(model: str = MODELS[0], *, tokens: int = 20, ttft_ms: int = 50, itl_ms: int = 20) -> bytes:
    pacing = {"tokens": tokens, "ttft_ms": ttft_ms, "itl_ms": itl_ms}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({**body, "sidestream": pacing}).encode()


async def _whole(port: int, body: bytes, fault: str | None = None) -> int:
    headers = [("X-Test-Fault", fault)] if fault else []
    response = await request(port, "POST", CHAT, body=body, headers=headers)
    try:
        with contextlib.suppress(ConnectionError):
            await response.body()
    finally:
        response.close()
    return response.status


async def _leave_early(port: int) -> None:
    """client_disconnected: read two chunks of a long stream, then hang up."""
    response = await request(port, "POST", CHAT, body=chat(tokens=200, itl_ms=50))
    try:
        await response.chunk()
        await response.chunk()
    finally:
        response.close()


async def _read_nothing(port: int) -> None:
    """slow_client: a flood the client never reads, past --send-timeout."""
    response = await request(port, "POST", CHAT, body=chat(), headers=[("X-Test-Fault", "flood")])
    try:
        await asyncio.sleep(1.5)
    finally:
        response.close()


async def _overload(port: int, limit: int = 6, extra: int = 3) -> list[int]:
    """rejected_overload: `limit` streams held open, then `extra` more are refused with 503."""
    held: list[RawResponse] = []
    try:
        for _ in range(limit):
            held.append(
                await request(port, "POST", CHAT, body=chat(MODELS[1], tokens=15, itl_ms=100))
            )
        for response in held:
            await response.chunk()
        refused = [await _whole(port, chat()) for _ in range(extra)]
        for response in held:
            await response.body()
    finally:
        for response in held:
            response.close()
    return refused


async def every_outcome(port: int, limit: int = 6) -> list[int]:
    """One round of traffic through the sidecar on `port` (started with SIDECAR_FLAGS):
    completed (two models), first_token_timeout, idle_timeout, max_duration,
    client_disconnected, slow_client, upstream_error (500), rate_limited (429) and
    rejected_overload (`limit` streams held: the sidecar's --max-streams). Returns the
    overload round's statuses."""
    await asyncio.gather(
        _whole(port, chat(MODELS[0])),
        _whole(port, chat(MODELS[0], tokens=40, itl_ms=10)),
        _whole(port, chat(MODELS[1], tokens=30, ttft_ms=150, itl_ms=30)),
        _whole(port, chat(MODELS[1], ttft_ms=3000)),  # first_token_timeout
        _whole(port, chat(MODELS[0], tokens=3, ttft_ms=0, itl_ms=3000)),  # idle_timeout
        _whole(port, chat(MODELS[0], tokens=100, ttft_ms=0, itl_ms=300)),  # max_duration
    )
    await asyncio.gather(
        _leave_early(port),
        _read_nothing(port),
        _whole(port, chat(), "500"),
        _whole(port, chat(), "429"),
        _whole(port, chat(MODELS[1])),
        _whole(port, chat(MODELS[0], tokens=60, itl_ms=5)),
    )
    await _whole(port, chat(), "500")  # two failures in ~20 requests: over the alert's 5%
    return await _overload(port, limit)
