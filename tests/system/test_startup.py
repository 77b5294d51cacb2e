"""Start-up of the sidecar process: every listener bound before any serves, one line and exit
status 1 when start-up fails, port 0 and the ready file, `--admin-listen off`, `--version`.

Each test runs `python -m sidecar` as a child process. A failed start-up is watched from
outside: while the child lives, the test keeps connecting to the port that was free; every
attempt must be refused (nothing ever accepts, so nothing is ever reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from middleware.speedups import disabled
from sidecar.emulator import Stats, make_app
from tests.support.procs import free_port, get
from tests.support.servers import serve

SIDECAR = [sys.executable, "-m", "sidecar"]


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


def taken_port() -> socket.socket:
    """A 127.0.0.1 port held by a listening socket (what a second sidecar would meet)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


async def failed_start(args: list[str], watched: list[int]) -> tuple[int, str, list[str]]:
    """Run the sidecar until it exits (at most 20 s); meanwhile connect to `watched` ports
    over and over. Returns the exit status, stderr, and what each connect met that was not
    a refusal (an accept, a reset)."""
    process = await asyncio.create_subprocess_exec(
        *SIDECAR, *args, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
    )
    surprises: list[str] = []
    attempts = 0
    async with asyncio.timeout(20):
        while process.returncode is None:
            for port in watched:
                attempts += 1
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except ConnectionRefusedError:
                    continue
                except OSError as exc:
                    surprises.append(f"port {port}: {exc!r}")
                    continue
                surprises.append(f"port {port}: accepted")
                writer.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.005)
        stderr = (await process.stderr.read()).decode() if process.stderr else ""
    assert attempts > 0
    return process.returncode, stderr, surprises


async def test_admin_port_taken_exits_1_with_one_line_and_traffic_never_accepts() -> None:
    """The admin port in use ends start-up before the traffic port listens: exit status 1,
    one stderr line naming --admin-listen, the address and the OS error, and every connect
    to the traffic port during start-up is refused."""
    taken = taken_port()
    admin = taken.getsockname()[1]
    traffic = free_port()
    try:
        status, stderr, surprises = await failed_start(
            [
                "--upstream", "http://127.0.0.1:1",
                "--listen", f"127.0.0.1:{traffic}",
                "--admin-listen", f"127.0.0.1:{admin}",
            ],
            [traffic],
        )  # fmt: skip
    finally:
        taken.close()
    assert status == 1
    assert stderr.splitlines() == [
        f"sidestream: error: --admin-listen 127.0.0.1:{admin}: [Errno 98] Address already in use"
    ]
    assert surprises == []


async def test_traffic_port_taken_exits_1_with_one_line_and_admin_never_accepts() -> None:
    """The traffic port in use: exit status 1, one line naming --listen, and the admin port
    never accepts a connection."""
    taken = taken_port()
    traffic = taken.getsockname()[1]
    admin = free_port()
    try:
        status, stderr, surprises = await failed_start(
            [
                "--upstream", "http://127.0.0.1:1",
                "--listen", f"127.0.0.1:{traffic}",
                "--admin-listen", f"127.0.0.1:{admin}",
            ],
            [admin],
        )  # fmt: skip
    finally:
        taken.close()
    assert status == 1
    assert stderr.splitlines() == [
        f"sidestream: error: --listen 127.0.0.1:{traffic}: [Errno 98] Address already in use"
    ]
    assert surprises == []


@pytest.mark.parametrize("http2", [False, True])
async def test_a_bad_certificate_exits_1_with_one_line_and_no_port_accepts(
    tmp_path: Path, http2: bool
) -> None:
    """A --certfile that is not a certificate ends start-up before any port listens: exit
    status 1, one line naming the files (never their content), no connect accepted."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate, secret-looking bytes\n")
    traffic, admin = free_port(), free_port()
    status, stderr, surprises = await failed_start(
        [
            "--upstream", "http://127.0.0.1:1",
            "--listen", f"127.0.0.1:{traffic}",
            "--admin-listen", f"127.0.0.1:{admin}",
            "--certfile", str(garbage), "--keyfile", str(garbage),
            *(["--http2"] if http2 else []),
        ],
        [traffic, admin],
    )  # fmt: skip
    assert status == 1
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sidestream: error: --certfile {garbage}")
    assert "secret-looking" not in stderr
    assert surprises == []


def start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stderr=subprocess.PIPE)


async def wait_ready_file(path: Path, process: subprocess.Popen[bytes]) -> dict[str, str | None]:
    """The ready file's JSON, once it exists (bounded; fails at once if the child died)."""
    async with asyncio.timeout(20):
        while not await asyncio.to_thread(path.exists):
            assert process.poll() is None, process.stderr and process.stderr.read()
            await asyncio.sleep(0.01)
    data: dict[str, str | None] = json.loads(await asyncio.to_thread(path.read_text))
    return data


@pytest.mark.parametrize("admin", ["127.0.0.1:0", "off"])
async def test_port_0_and_the_ready_file_name_the_bound_ports(
    emulator: int, tmp_path: Path, admin: str
) -> None:
    """Port 0 binds a free port; `--ready-file` names every bound address as JSON once all
    listeners are up (admin null when `--admin-listen off`, which runs no admin listener);
    the start line names them too, with the version and the core that runs."""
    ready = tmp_path / "ready.json"
    process = start(
        [
            *SIDECAR,
            "--upstream", f"http://127.0.0.1:{emulator}",
            "--listen", "127.0.0.1:0",
            "--admin-listen", admin,
            "--ready-file", str(ready),
            "--log-level", "info",
        ]
    )  # fmt: skip
    try:
        addresses = await wait_ready_file(ready, process)
        assert set(addresses) == {"listen", "admin", "version", "core", "python"}
        listen = addresses["listen"]
        assert listen is not None and listen.startswith("127.0.0.1:")
        port = int(listen.rpartition(":")[2])
        assert port != 0
        status, _, body = await get(port, "/v1/stream?ttft_ms=0&itl_ms=0&tokens=2")
        assert status == 200 and b"[DONE]" in body
        if admin == "off":
            assert addresses["admin"] is None
        else:
            assert addresses["admin"] is not None
            admin_port = int(addresses["admin"].rpartition(":")[2])
            assert (await get(admin_port, "/livez"))[0] == 200
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(asyncio.to_thread(process.wait), 20) == 0
        assert process.stderr is not None
        first = process.stderr.readline().decode()
        version = importlib.metadata.version("sidestream")
        core = "pure-Python core: SIDESTREAM_NO_EXTENSIONS=1" if disabled() else "compiled core"
        assert f"sidestream {version} ({core}) on {listen}" in first
        assert f"(admin {addresses['admin'] or 'off'}," in first
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


def test_version_prints_the_package_version_and_its_core() -> None:
    """`sidestream --version` prints the installed package's version and which core runs
    (compiled, or pure Python where SIDESTREAM_NO_EXTENSIONS is set), and exits 0."""
    out = subprocess.run(
        [*SIDECAR, "--version"], capture_output=True, text=True, check=True, env=os.environ
    )
    core = "pure-Python core: SIDESTREAM_NO_EXTENSIONS=1" if disabled() else "compiled core"
    assert out.stdout == f"sidestream {importlib.metadata.version('sidestream')} ({core})\n"
