"""The deployment secret that keys resume's credential hash, in sidecar processes
(`--resume-secret-file`, `SIDESTREAM_RESUME_SECRET_FILE`) sharing one real `redis-server`:
replicas with the same secret serve each other's streams, a replica with another secret
cannot resume or stop them, a Redis store without a secret does not start, and the secret
shows up nowhere the sidecar writes: logs, access lines, spans, the ready file, the live view,
nor Redis."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.otlpreceiver import Receiver
from tests.support.procs import CHAT, Child, chat, free_port
from tests.support.redis import RedisServer
from tests.support.servers import serve
from tests.support.sseparse import parse

TOKEN = "tenant-a-" + secrets.token_hex(8)
OWNER = [("Authorization", f"Bearer {TOKEN}")]


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def secret_file(directory: Path, name: str, secret: bytes) -> str:
    path = directory / name
    path.write_bytes(secret + b"\n")
    return str(path)


async def events_until(response: Any, count: int) -> bytes:
    body = b""
    while len(parse(body)) < count:
        chunk = await response.chunk()
        assert chunk is not None, body
        body += chunk
    return body


async def answer(port: int, method: str, stream_id: str, headers: list[tuple[str, str]]) -> int:
    """The status of a resume (GET, read to its end) or a stop (DELETE) of `stream_id`."""
    response = await request(port, method, f"/sidestream/v1/streams/{stream_id}", headers=headers)
    if response.status != 200:
        await response.body()
    response.close()
    return response.status


async def test_a_replica_with_another_secret_cannot_resume_or_stop_a_stream(
    emulator: tuple[int, Stats], redis: RedisServer, tmp_path: Path
) -> None:
    """Rule: on one Redis, a replica given another secret answers 404 stream_not_found to a
    resume and to a DELETE of a stream another replica produces, with the same credentials or
    with none, and the stream goes on; a replica given the same secret resumes it and stops it
    (204, the reader ends with `cancelled`)."""
    upstream, stats = emulator
    mine, theirs = secrets.token_bytes(32), secrets.token_bytes(32)
    store = ("--resume", "--resume-store", redis.url, "--resume-secret-file")
    a = Child(upstream, *store, secret_file(tmp_path, "a", mine))
    b = Child(upstream, *store, secret_file(tmp_path, "b", theirs))
    c = Child(upstream, *store, secret_file(tmp_path, "c", mine))
    try:
        for child in (a, b, c):
            await child.ready()
        first = await request(a.port, "POST", CHAT, body=chat(2000, 20), headers=OWNER)
        stream_id = first.header("sidestream-stream-id")
        assert stream_id is not None
        head = await events_until(first, 3)
        anonymous = await request(a.port, "POST", CHAT, body=chat(2000, 20))
        anonymous_id = anonymous.header("sidestream-stream-id")
        assert anonymous_id is not None
        await events_until(anonymous, 3)
        refused = [
            await answer(b.port, "GET", stream_id, OWNER),
            await answer(b.port, "DELETE", stream_id, OWNER),
            await answer(b.port, "GET", anonymous_id, []),
            await answer(b.port, "DELETE", anonymous_id, []),
        ]
        going_on = parse(head + await events_until(first, 7))
        cancelled = stats.streams_cancelled
        reader = await request(c.port, "GET", f"/sidestream/v1/streams/{stream_id}", headers=OWNER)
        await events_until(reader, 2)
        stopped = await answer(c.port, "DELETE", stream_id, OWNER)
        ended = parse(await asyncio.wait_for(reader.body(), 10))
        for response in (first, anonymous, reader):
            response.close()
    finally:
        for child in (a, b, c):
            child.kill()
    assert refused == [404, 404, 404, 404]
    assert cancelled == 0 and len(going_on) >= 10
    assert all(event_id == f"{stream_id}:{n}" for n, (_, _, event_id) in enumerate(going_on, 1))
    assert reader.status == 200 and stopped == 204
    assert json.loads(ended[-1][1])["error"]["code"] == "cancelled"


async def test_a_redis_store_without_a_secret_exits_with_one_line(redis: RedisServer) -> None:
    """Rule: `--resume` with a Redis store and no secret file does not start: exit status 2,
    one line on stderr naming `--resume-secret-file`, no traceback."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDESTREAM_")}
    argv = [sys.executable, "-m", "sidecar", "--upstream", f"http://127.0.0.1:{free_port()}"]
    argv += ["--listen", f"127.0.0.1:{free_port()}", "--resume", "--resume-store", redis.url]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, timeout=60, env=clean, check=False
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and "--resume-secret-file" in err and "Traceback" not in err


def spawn(argv: list[str], env: dict[str, str], directory: Path) -> subprocess.Popen[bytes]:
    """The sidecar, its stdout and stderr going to files `out` and `err` in `directory`."""
    with open(directory / "out", "wb") as out, open(directory / "err", "wb") as err:
        return subprocess.Popen(argv, stdout=out, stderr=err, env=env)


async def redis_contents(url: str) -> bytes:
    """Every key and value in Redis, as bytes (strings whole, streams entry by entry)."""
    client = aioredis.from_url(url)
    try:
        found = b""
        for key in await client.keys("*"):
            kind = await client.type(key)
            if kind == b"stream":
                value = repr(await client.xrange(key)).encode()
            elif kind == b"string":
                value = await client.get(key) or b""
            else:
                value = kind
            found += key + b" " + value + b"\n"
        return found
    finally:
        await client.aclose()


async def test_the_secret_appears_in_no_log_span_ready_file_live_view_or_redis(
    emulator: tuple[int, Stats], redis: RedisServer, tmp_path: Path
) -> None:
    """Rule: the secret never leaves the process: with `SIDESTREAM_RESUME_SECRET_FILE`, debug
    logs, the access log and OTLP spans on, after a stream, a resume, a refused resume and a
    stop, its bytes are in none of stderr, stdout (the access lines), the exported spans, the
    ready file or the live view; Redis holds neither the secret nor the credential."""
    upstream, _ = emulator
    secret = b"known-resume-secret-" + secrets.token_hex(16).encode()
    port, admin, ready = free_port(), free_port(), tmp_path / "ready.json"
    receiver = Receiver()
    async with serve(receiver) as otlp:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SIDESTREAM_"))}
        env = {
            **clean,
            "SIDESTREAM_RESUME_SECRET_FILE": secret_file(tmp_path, "secret", secret),
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{otlp}/v1/traces",
        }
        argv = [sys.executable, "-m", "sidecar", "--upstream", f"http://127.0.0.1:{upstream}"]
        argv += ["--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"]
        argv += ["--resume", "--resume-store", redis.url, "--log-level", "debug"]
        argv += ["--ready-file", str(ready)]
        process = spawn(argv, env, tmp_path)
        try:
            for _ in range(400):
                assert process.poll() is None, (tmp_path / "err").read_text()
                if ready.exists():
                    break
                await asyncio.sleep(0.025)
            first = await request(port, "POST", CHAT, body=chat(200, 10), headers=OWNER)
            stream_id = first.header("sidestream-stream-id")
            assert stream_id is not None
            await events_until(first, 3)
            view = await request(admin, "GET", "/streams")
            live = await view.body()
            view.close()
            first.close()
            other = [("Authorization", "Bearer someone-else")]
            refused = await answer(port, "GET", stream_id, other)
            resumed = await answer(port, "GET", stream_id, OWNER)
            stopped = await answer(port, "DELETE", stream_id, OWNER)
            stored = await redis_contents(redis.url)
            process.send_signal(signal.SIGTERM)  # the exit flushes the spans
            code = await asyncio.to_thread(process.wait, 30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    logs, lines = (tmp_path / "err").read_bytes(), (tmp_path / "out").read_bytes()
    spans = b"".join(span.SerializeToString() for span in receiver.spans)
    assert code == 0 and (refused, resumed, stopped) == (404, 200, 204)
    # What was searched holds what it should: the stream, its debug lines, its spans.
    assert stream_id.encode() in lines and b"DEBUG" in logs and stream_id.encode() in stored
    assert b"sidestream.resume" in spans and b'"listen"' in ready.read_bytes()
    assert view.status == 200 and b"/v1/chat/completions" in live
    for place in (logs, lines, spans, ready.read_bytes(), live, stored):
        assert secret not in place
    assert TOKEN.encode() not in stored
