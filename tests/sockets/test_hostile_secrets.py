"""Secrets stay secret: credentials a client sends never show up in logs or error bodies.

Every request here carries an `Authorization` bearer token, a cookie and API-key headers,
and is sent down a failure path (upstream refused, upstream silent, upstream dying mid-stream,
refused framing, oversized headers and body, TRACE). All log records of every logger, at
DEBUG, and every response body are searched for the secret values.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.servers.http1 import protocol_class
from tests.support.servers import bound_socket, serve

SECRETS = ("sk-SECRET-bearer-4242", "COOKIE-sess-777", "KEY-apikey-999", "KEY-azure-555")
CREDENTIALS = (
    f"Authorization: Bearer {SECRETS[0]}\r\nCookie: session={SECRETS[1]}\r\n"
    f"X-Api-Key: {SECRETS[2]}\r\napi-key: {SECRETS[3]}\r\n"
).encode()


def sidecar_app(upstream_port: int, *flags: str) -> object:
    settings = load(["--upstream", f"http://127.0.0.1:{upstream_port}", *flags], environ={})
    return build_guard(settings, StreamRegistry())


async def exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def post(extra: bytes = b"", body: bytes = b'{"stream": true}') -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + CREDENTIALS
        + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def test_credentials_never_reach_logs_or_error_bodies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Authorization, cookies and API keys appear in no log line and no error body, on any failure."""
    caplog.set_level(logging.DEBUG)
    answers: list[bytes] = []
    release = asyncio.Event()

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"/silent" in head:
            await release.wait()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            b'14\r\ndata: {"x": "a"}\n\n\r\n'
        )
        await writer.drain()
        writer.close()  # mid-body: upstream_protocol_error

    server = await asyncio.start_server(dying, "127.0.0.1", 0)
    upstream = server.sockets[0].getsockname()[1]
    closed = bound_socket()
    closed_port = closed.getsockname()[1]
    closed.close()
    flags = ("--first-token-timeout", "0.3", "--max-body", "100", "--max-header-bytes", "2048")
    options = {"http": protocol_class(1.0, 2048 + 8192)}
    try:
        async with (
            serve(sidecar_app(upstream, *flags), **options) as port,
            serve(sidecar_app(closed_port, *flags), **options) as refused_port,
        ):
            answers.append(await exchange(refused_port, post()))  # 502
            answers.append(await exchange(port, post()))  # upstream dies mid-stream
            silent = post().replace(b"/v1/chat/completions", b"/silent")
            answers.append(await exchange(port, silent))  # 504
            answers.append(await exchange(port, post(b"Transfer-Encoding: chunked\r\n")))  # 400
            answers.append(await exchange(port, post(b"X-Big: " + b"b" * 3000 + b"\r\n")))  # 431
            answers.append(await exchange(port, post(body=b"x" * 500)))  # 413
            answers.append(await exchange(port, post().replace(b"POST", b"TRACE", 1)))  # 405
            answers.append(await exchange(port, post(b"X-Bad: a\x00b\r\n")))  # 400 from the parser
    finally:
        release.set()
        await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()
    statuses = [a.split(b" ", 2)[1] for a in answers]
    assert statuses == [b"502", b"200", b"504", b"400", b"431", b"413", b"405", b"400"], statuses
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    for secret in SECRETS:
        assert secret not in logged
        for answer in answers:
            assert secret.encode() not in answer


def test_admin_binds_loopback_and_traffic_all_interfaces_by_default() -> None:
    """The admin port (drain, metrics) listens on 127.0.0.1 unless configured; traffic on all."""
    settings = load(["--upstream", "http://127.0.0.1:8000"], environ={})
    assert settings.admin_listen == ("127.0.0.1", 9901)
    assert settings.listen == ("0.0.0.0", 8080)
    moved = load(["--upstream", "http://u:1"], environ={"SIDESTREAM_ADMIN_LISTEN": "0.0.0.0:9000"})
    assert moved.admin_listen == ("0.0.0.0", 9000)
