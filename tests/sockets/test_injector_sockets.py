"""The injection webhook on real sockets: plain HTTP under uvicorn, and certificate reload
over real TLS connections (the ASGI-level tests are tests/asgi/test_injector.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from pathlib import Path

import pytest

from sidecar.injector import InjectorApp
from sidecar.injector.__main__ import _Config
from sidecar.injector.tls import ReloadingCertificate
from tests.asgi.test_injector import fixture, write_pair
from tests.support.clients import connection, read_response, request
from tests.support.servers import _QuietUvicorn, bound_socket, serve


async def test_plain_http_over_a_real_socket() -> None:
    """Without certificate flags the app serves plain HTTP under uvicorn."""
    async with serve(InjectorApp()) as port:
        body = json.dumps(fixture("plain")).encode()
        response = await request(
            port, "POST", "/mutate", body=body, headers=[("Content-Type", "application/json")]
        )
        assert response.status == 200
        assert json.loads(await response.body())["response"]["patchType"] == "JSONPatch"
        response.close()


# --- TLS certificate reload ------------------------------------------------------------------


def client_context(cert_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=cert_pem.decode())
    return context


async def livez_over_tls(
    opened: contextlib.AsyncExitStack, port: int, context: ssl.SSLContext
) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    """GET /livez on a new TLS connection, left open; `opened` closes it however the test ends."""
    reader, writer = await opened.enter_async_context(
        connection(port, ssl=context, server_hostname="localhost")
    )
    writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
    response = await read_response(reader, writer)
    await response.body()
    return response.status, reader, writer


async def test_certificate_reload_without_restart(tmp_path: Path) -> None:
    """New certificate files are picked up by new handshakes; a connection opened before
    the rotation keeps working; the server never restarts."""
    cert_a, _ = write_pair(tmp_path, "injector-a")
    certificate = ReloadingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key", interval=0.02)
    app = InjectorApp(certificate=certificate)
    config = _Config(app, context=certificate.context, lifespan="on", log_level="warning")
    sock = bound_socket()
    port = sock.getsockname()[1]
    server = _QuietUvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    opened = contextlib.AsyncExitStack()
    try:
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.005)
        status, reader, writer = await livez_over_tls(opened, port, client_context(cert_a))
        assert status == 200

        cert_b, _ = write_pair(tmp_path, "injector-b")
        for _ in range(500):
            if certificate.reloads:
                break
            await asyncio.sleep(0.01)
        assert certificate.reloads == 1

        status, _, new_writer = await livez_over_tls(opened, port, client_context(cert_b))
        assert status == 200
        new_writer.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            await livez_over_tls(opened, port, client_context(cert_a))

        writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")  # the old connection
        assert (await read_response(reader, writer)).status == 200
        writer.close()
        assert not task.done()
    finally:
        await opened.aclose()
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()
