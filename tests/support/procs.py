"""A sidecar child process and small request helpers, for tests that need the real CLI.

`Child` starts `python -m sidecar` on free 127.0.0.1 ports in front of a given upstream
port (extra flags such as `--http2` pass through).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.clients import request
from tests.support.servers import bound_socket

CHAT = "/v1/chat/completions"


def free_port() -> int:
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def later_port() -> int:
    """A free port for a server that binds it seconds from now (llama.cpp loads its model
    first). Below the kernel's ephemeral range, where `free_port` takes its ports: any
    outbound connection made meanwhile (a health probe, another test's client) takes its
    source port from that range and may take a port picked there before the server binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError("no free port below the ephemeral range")


class Child:
    """A sidecar process with its traffic and admin ports."""

    def __init__(self, upstream_port: int, *flags: str) -> None:
        self.port, self.admin = free_port(), free_port()
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "sidecar",
                "--listen", f"127.0.0.1:{self.port}",
                "--admin-listen", f"127.0.0.1:{self.admin}",
                "--upstream", f"http://127.0.0.1:{upstream_port}",
                "--log-level", "warning",
                *flags,
            ],
            stderr=subprocess.PIPE,
        )  # fmt: skip

    async def ready(self) -> None:
        """Wait until both the admin and the traffic port accept connections."""
        for port in (self.admin, self.port):
            for _ in range(400):
                assert self.process.poll() is None, (
                    self.process.stderr and self.process.stderr.read()
                )
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.025)
                    continue
                writer.close()
                break
            else:
                raise TimeoutError("the sidecar did not start")

    async def exit_code(self, timeout: float) -> int:
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.process.wait), timeout)
        except TimeoutError:
            return -999

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()


def chat(tokens: int, itl_ms: int) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "sidestream": {"tokens": tokens, "ttft_ms": 0, "itl_ms": itl_ms},
        }
    ).encode()


async def get(
    port: int, path: str, method: str = "GET", body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    response = await request(port, method, path, body=body)
    try:
        data = await response.body()
    finally:
        response.close()
    return response.status, {k.lower(): v for k, v in response.headers}, data
