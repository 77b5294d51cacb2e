"""`sidestream probe` through a real nginx in front of a real sidecar (the CLI as a process).

nginx runs the shipped block (`deploy/nginx/sidestream.conf`) as `test_edge_nginx` starts it,
changed per test into the hop each check exists to find. The sidecar answers the probe
itself: its upstream is a closed port, so nothing here reaches an inference server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from tests.support.procs import free_port
from tests.support.servers import serve
from tests.system.test_edge_nginx import nginx, render, until_listening

GZIP = "gzip on; gzip_types text/event-stream; gzip_min_length 1;"


@contextlib.asynccontextmanager
async def path(
    tmp: Path, keepalive: str = "0.5", gzip: str = "gzip off;", **directives: str
) -> AsyncIterator[int]:
    """nginx (the shipped block, `gzip off;` replaced by `gzip`, `directives` set) in front of
    a sidecar whose upstream is closed; yields nginx's port."""
    flags = ["--upstream", "http://127.0.0.1:1", "--keepalive-interval", keepalive]
    guard = build_guard(load(flags, environ={}), StreamRegistry())
    async with serve(guard, "sidecar") as sidecar:
        port = free_port()
        block = render(sidecar, port, **directives).replace("gzip off;", gzip)
        with nginx(tmp, block) as process:
            await until_listening(port, process)
            yield port


async def probe(port: int, *flags: str) -> tuple[int, dict[str, Any], str]:
    """Run `sidestream probe` against `port` twice (JSON, then the table): the exit status, the JSON
    report's checks by name, and the table (printed, for the record)."""
    url = f"http://127.0.0.1:{port}/"
    results = []
    for extra in (("--json",), ()):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar", "probe", url, *flags, *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode in (0, 1), err.decode()
        results.append((process.returncode, out.decode()))
    (code, report), (code_table, text) = results
    assert code == code_table
    print(text)
    return code, {c["name"]: c for c in json.loads(report)["checks"]}, text


async def test_the_shipped_block_passes_every_check(tmp_path: Path) -> None:
    """Rule: the nginx block sidestream ships streams unbuffered, uncompressed, and carries a
    silence, so the probe finds nothing (exit 0) and sees the guard's keep-alives."""
    async with path(tmp_path) as port:
        code, checks, _ = await probe(port, "--gap-s", "2")
    assert code == 0
    assert {n: c["status"] for n, c in checks.items()} == {
        "first byte": "ok",
        "headers": "ok",
        "bunching": "ok",
        "compression": "ok",
        "keep-alives": "ok",
        "idle cut": "ok",
    }
    assert checks["headers"]["data"]["Server"].startswith("nginx")


async def test_gzip_for_event_streams_is_reported_as_compression(tmp_path: Path) -> None:
    """Rule: a hop that gzips text/event-stream (for a client that accepts gzip) is reported
    as compression, with the fix; events still pass one by one (nginx flushes unbuffered)."""
    async with path(tmp_path, gzip=GZIP) as port:
        code, checks, _ = await probe(port, "--events", "10")
    assert code == 1
    assert checks["compression"]["status"] == "fail"
    assert checks["compression"]["data"]["content_encoding"] == "gzip"
    assert "gzip off" in checks["compression"]["fix"]
    assert checks["bunching"]["status"] == "ok"


async def test_buffering_that_ignores_x_accel_buffering_is_reported_as_bunching(
    tmp_path: Path,
) -> None:
    """Rule: a hop that holds events back (nginx buffering on, `X-Accel-Buffering` ignored,
    gzip behind it) is reported as bunching with the fix, and the bytes held per release are
    estimated between one nginx buffer page (4 KiB) and all its buffers (proxy 8 x 4 KiB plus
    gzip 32 x 4 KiB)."""
    held = f"proxy_ignore_headers X-Accel-Buffering; {GZIP}"
    async with path(tmp_path, gzip=held, proxy_buffering="on") as port:
        flags = ("--events", "60", "--interval-ms", "40", "--pad", "1024")
        code, checks, _ = await probe(port, *flags)
    assert code == 1
    bunching = checks["bunching"]
    assert bunching["status"] == "fail"
    assert "proxy_buffering off" in bunching["fix"]
    assert 4 * 1024 <= bunching["data"]["buffer_bytes_estimate"] <= 160 * 1024
    assert bunching["data"]["largest_burst_events"] >= 4


async def test_a_read_timeout_shorter_than_the_gap_is_reported_as_an_idle_cut(
    tmp_path: Path,
) -> None:
    """Rule: `proxy_read_timeout 3s` cuts a bare 5 s silence after about 3 s, and the report
    says so; the guard's keep-alives (every 1 s) carry the same silence, so it is a warning
    with the fix, not a failure."""
    async with path(tmp_path, keepalive="1", proxy_read_timeout="3s") as port:
        code, checks, _ = await probe(port, "--events", "4", "--gap-s", "5")
    cut = checks["idle cut"]
    assert cut["status"] == "warn", cut
    assert 2.5 <= cut["data"]["cut_after_s"] <= 4.5
    assert cut["data"]["cut_with_keepalives_after_s"] is None
    assert "proxy_read_timeout" in cut["fix"]
    assert checks["keep-alives"]["status"] == "ok"
    assert code == 0


async def test_an_idle_cut_without_keepalives_to_carry_it_fails(tmp_path: Path) -> None:
    """Rule: with the sidecar's keep-alives off, the silence is cut with and without them:
    the idle-cut check fails and the exit status is 1."""
    async with path(tmp_path, keepalive="off", proxy_read_timeout="1s") as port:
        code, checks, _ = await probe(port, "--events", "2", "--gap-s", "2")
    assert code == 1
    assert checks["idle cut"]["status"] == "fail"
    assert checks["idle cut"]["data"]["cut_with_keepalives_after_s"] is not None
