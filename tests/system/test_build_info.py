"""The sidecar reports what it is: version, core and Python in the ready file and as the
`sidestream_build_info` gauge on the admin `/metrics`, with telemetry off and on (a running
sidecar process, its ready file and its admin port)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import platform
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from middleware.speedups import disabled
from sidecar.emulator import Stats, make_app
from tests.support.procs import get
from tests.support.servers import serve
from tests.system.test_startup import SIDECAR, wait_ready_file

CORE = "pure-Python core: SIDESTREAM_NO_EXTENSIONS=1" if disabled() else "compiled core"
BUILD_INFO = re.compile(r"^sidestream_build_info\{(.*)\} 1$", re.MULTILINE)


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env, stderr=subprocess.PIPE)


@pytest.mark.parametrize("telemetry", ["off", "on"])
async def test_version_and_core_in_the_ready_file_and_the_metrics(
    emulator: int, tmp_path: Path, telemetry: str
) -> None:
    """Rule: the ready file names the version, the core and the Python that run, and
    /metrics carries them as the labels of `sidestream_build_info 1`, one series, with or
    without the OpenTelemetry SDK."""
    ready = tmp_path / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true" if telemetry == "off" else "false"
    process = start(
        [
            *SIDECAR,
            "--upstream", f"http://127.0.0.1:{emulator}",
            "--listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0",
            "--ready-file", str(ready),
            "--log-level", "warning",
        ],
        env,
    )  # fmt: skip
    try:
        facts = await wait_ready_file(ready, process)
        expected = {
            "version": importlib.metadata.version("sidestream"),
            "core": CORE,
            "python": platform.python_version(),
        }
        assert {k: facts[k] for k in expected} == expected
        admin = facts["admin"]
        assert admin is not None
        status, headers, body = await get(int(admin.rpartition(":")[2]), "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        text = body.decode()
        [labels] = BUILD_INFO.findall(text)
        assert dict(re.findall(r'(\w+)="([^"]*)"', labels)) == expected
        assert "# TYPE sidestream_build_info gauge" in text
        assert "sidestream_active_streams 0" in text
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(asyncio.to_thread(process.wait), 20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()
