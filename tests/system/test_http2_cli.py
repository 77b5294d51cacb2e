"""The real CLI, `python -m sidecar --http2`, as a child process in front of the emulator:
h2c and HTTP/1.1 on one port (curl, h2load), h2 by ALPN over TLS, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import ssl
import tempfile
from collections.abc import AsyncIterator

import httpx
import pytest

from sidecar.emulator import Stats, make_app
from tests.sockets.test_http2 import STREAM
from tests.support.clients import request as h1_request
from tests.support.h2peers import H2Client
from tests.support.procs import Child
from tests.support.servers import serve
from tests.support.sseparse import parse
from tests.support.tools import tool


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


async def status(port: int, path: str) -> int:
    response = await h1_request(port, "GET", path)
    response.close()
    return response.status


async def run(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode or 0, out.decode()


async def test_cli_http2_serves_h2c_and_http1_on_one_port(emulator: int) -> None:
    """`--http2` serves HTTP/1.1 and h2c (prior knowledge) on one port: curl
    --http2-prior-knowledge and the raw HTTP/1.1 client both stream, and h2load's 200
    requests over 4 connections all succeed."""
    curl, h2load = tool("curl"), tool("h2load")
    child = Child(emulator, "--http2", "--keepalive-interval", "off")
    try:
        await child.ready()
        url = f"http://127.0.0.1:{child.port}" + STREAM.format(itl=1, tokens=3)
        code, out = await run(
            curl, "-sS", "--http2-prior-knowledge", "-o", "-", "-w", "\n%{http_version}", url
        )
        assert code == 0 and out.endswith("\n2") and "data: [DONE]" in out
        response = await h1_request(child.port, "GET", STREAM.format(itl=1, tokens=3))
        body = b""
        while (chunk := await asyncio.wait_for(response.chunk(), 5)) is not None:
            body += chunk
        response.close()
        assert response.status == 200 and parse(body)[-1][1] == "[DONE]"
        code, out = await run(h2load, "-n", "200", "-c", "4", "-m", "10", url)
        assert code == 0 and "200 succeeded, 0 failed, 0 errored" in out, out
    finally:
        child.kill()


def self_signed(directory: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = os.path.join(directory, "c.pem"), os.path.join(directory, "k.pem")
    with open(certfile, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(keyfile, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return certfile, keyfile


async def test_cli_http2_with_tls_negotiates_h2_by_alpn(emulator: int) -> None:
    """With `--certfile/--keyfile`, ALPN picks h2 for a client offering it and HTTP/1.1 for
    one that does not, on the same TLS port."""
    with tempfile.TemporaryDirectory() as tmp:
        certfile, keyfile = self_signed(tmp)
        child = Child(emulator, "--http2", "--certfile", certfile, "--keyfile", keyfile)
        try:
            await child.ready()
            trust = ssl.create_default_context(cafile=certfile)
            url = f"https://localhost:{child.port}" + STREAM.format(itl=1, tokens=2)
            versions = []
            for http2 in (True, False):
                async with httpx.AsyncClient(verify=trust, http2=http2, timeout=10) as client:
                    response = await client.get(url)
                assert parse(response.content)[-1][1] == "[DONE]"
                versions.append(response.http_version)
        finally:
            child.kill()
    assert versions == ["HTTP/2", "HTTP/1.1"]


async def test_cli_http2_drain_on_sigterm(emulator: int) -> None:
    """Drain over HTTP/2 is the same as over HTTP/1.1: on SIGTERM a new stream gets 503 with
    Retry-After, a stream in flight ends with a retryable terminal event at the drain
    timeout, and the process exits 0."""
    child = Child(emulator, "--http2", "--drain-timeout", "0.6", "--keepalive-interval", "off")
    try:
        await child.ready()
        async with H2Client(child.port).connected() as client:
            long = client.request(STREAM.format(itl=50, tokens=1000))
            await asyncio.wait_for(long.first_data.wait(), 5)
            child.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(5):
                while await status(child.admin, "/readyz") != 503:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)  # another process's state: nothing to await
            refused = client.request(STREAM.format(itl=1, tokens=2))
            await asyncio.wait_for(asyncio.gather(long.ended.wait(), refused.ended.wait()), 5)
        code = await child.exit_code(timeout=5)
    finally:
        child.kill()
    assert refused.status == 503 and refused.header(b"retry-after") == b"1"
    assert json.loads(parse(long.body)[-1][1])["error"]["code"] == "shutting_down"
    assert code == 0
