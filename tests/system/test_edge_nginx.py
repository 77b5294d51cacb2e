"""The edge path: nginx (the Debian package) in front of the sidecar in front of the emulator.

nginx runs with the block sidestream ships, `deploy/nginx/sidestream.conf`, rendered with
test ports (and, where a test says so, a shorter read timeout or buffering turned back on),
as a single foreground process (`master_process off`) with every path in a temp directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.procs import free_port
from tests.support.servers import serve
from tests.support.sseparse import comments, parse
from tests.support.tools import tool

SHIPPED = Path(__file__).parents[2] / "deploy" / "nginx" / "sidestream.conf"
CHAT = "/v1/chat/completions"


def render(upstream_port: int, listen_port: int, **directives: str) -> str:
    """The shipped block with test ports; `directives` replace the values of those directives."""
    text = SHIPPED.read_text()
    text = text.replace("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream_port};")
    text = text.replace("listen 80;", f"listen 127.0.0.1:{listen_port};")
    for name, value in directives.items():
        text, n = re.subn(rf"^(\s*){name} [^;]+;", rf"\g<1>{name} {value};", text, flags=re.M)
        assert n == 1, f"{name} is not in {SHIPPED}"
    return text


@contextlib.contextmanager
def nginx(tmp: Path, block: str) -> Iterator[subprocess.Popen[bytes]]:
    binary = tool("nginx")
    (tmp / "sidestream.conf").write_text(block)
    temps = "\n".join(
        f"{kind}_temp_path {tmp}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (tmp / "nginx.conf").write_text(
        f"daemon off;\nmaster_process off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n"
        f"events {{ worker_connections 64; }}\n"
        f"http {{\naccess_log off;\n{temps}\ninclude {tmp}/sidestream.conf;\n}}\n"
    )
    process = subprocess.Popen(
        [binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf")], stderr=subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(5)
        if process.stderr:
            process.stderr.close()


async def until_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        assert process.poll() is None, process.stderr and process.stderr.read()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        return
    raise TimeoutError("nginx did not start")


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


@contextlib.asynccontextmanager
async def edge(
    tmp: Path, upstream: int, sidecar_flags: tuple[str, ...] = (), **directives: str
) -> AsyncIterator[int]:
    """nginx -> sidecar -> `upstream`; yields nginx's port. No sidecar when flags are None."""
    flags = ["--upstream", f"http://127.0.0.1:{upstream}", *sidecar_flags]
    async with serve(build_guard(load(flags, environ={}), StreamRegistry()), "sidecar") as sidecar:
        port = free_port()
        with nginx(tmp, render(sidecar, port, **directives)) as process:
            await until_listening(port, process)
            yield port


def body(**pacing: object) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "sidestream": pacing,
        }
    ).encode()


async def token_arrivals(port: int, payload: bytes) -> tuple[list[float], bytes]:
    response = await request(
        port, "POST", CHAT, body=payload, headers=[("Content-Type", "application/json")]
    )
    try:
        assert response.status == 200
        data = await response.body()
    finally:
        response.close()
    times = [
        t for t, chunk in response.arrivals if b'"content":"' in chunk.replace(b'"content":""', b"")
    ]
    return times, data


async def test_tokens_arrive_one_by_one_through_nginx(tmp_path: Path, emulator: int) -> None:
    """With the shipped block, tokens leave nginx one by one as the upstream produces them."""
    async with edge(tmp_path, emulator) as port:
        times, data = await token_arrivals(port, body(tokens=6, ttft_ms=0, itl_ms=150))
    assert [e[1] for e in parse(data)][-1] == "[DONE]"
    assert len(times) >= 5  # separate arrivals, not one burst
    assert times[-1] - times[0] > 0.5


async def test_keepalives_carry_a_silence_longer_than_nginx_read_timeout(
    tmp_path: Path, emulator: int
) -> None:
    """A 2.5 s prefill passes an nginx with a 1 s read timeout thanks to keep-alives; without
    them (control) nginx cuts the same stream."""
    slow = body(tokens=3, ttft_ms=2500, itl_ms=10)
    flags = ("--keepalive-interval", "0.3")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with edge(tmp_path / "a", emulator, flags, proxy_read_timeout="1s") as port:
        _, data = await token_arrivals(port, slow)
    assert [e[1] for e in parse(data)][-1] == "[DONE]" and len(comments(data)) >= 5

    flags = ("--keepalive-interval", "off")
    async with edge(tmp_path / "b", emulator, flags, proxy_read_timeout="1s") as port:
        response = await request(port, "POST", CHAT, body=slow)
        data = b""
        with contextlib.suppress(ConnectionError):
            data = await response.body()
        response.close()
    assert b"[DONE]" not in data


async def test_x_accel_buffering_streams_through_nginx_with_buffering_on(
    tmp_path: Path, emulator: int
) -> None:
    """`X-Accel-Buffering: no` from the sidecar makes an nginx left at `proxy_buffering on` stream.

    nginx consumes the header (the client never sees it) and switches that response to
    unbuffered. (nginx 1.22 with a fast reader happens to pass a chunked upstream's reads on
    even when buffering; the header makes it certain, whatever the buffer settings.)
    """
    async with edge(tmp_path, emulator, proxy_buffering="on") as port:
        response = await request(port, "POST", CHAT, body=body(tokens=6, ttft_ms=0, itl_ms=150))
        await response.body()
        response.close()
    assert response.header("x-accel-buffering") is None  # read and acted on by nginx
    assert response.header("cache-control") == "no-cache, no-transform"
    times = [t for t, c in response.arrivals if b'"content":"' in c.replace(b'"content":""', b"")]
    assert len(times) >= 5 and times[-1] - times[0] > 0.5
