"""Forced usage on the wire (issue 47): through the sidecar, a client that did not ask for
usage reads under `--usage force` and `--usage continuous` the bytes it reads under `--usage
pass` and from the upstream directly, for every SSE framing; a client that asked reads the
upstream's own bytes. The upstream is a scripted OpenAI-style server
(tests/support/usage_streams.py) whose stream depends on what the request asked for.

A property test drives generated framings through the sidecar (HTTP/1.1 both sides, a raw
upstream writing each read as a chunk of its own); a parametrized test runs the named quirks
with the other features on: resume (the stored events are the ones the client read), the
middleware `StreamGuard` in front of an app, HTTP/2 downstream (hypercorn), an h2c upstream
and an https upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry
from middleware.telemetry.semconv import METRIC_USAGE_UNCHANGED
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.servers.hypercorn_listener import HypercornListener
from tests.support.clients import request
from tests.support.fuzzing import examples
from tests.support.h2peers import H2Client
from tests.support.servers import bound_socket, serve
from tests.support.sseparse import parse
from tests.support.upstreams import RawUpstream
from tests.support.usage_streams import QUIRKS, Script, ScriptedServer, raw_handler, scripts

CHAT = "/v1/chat/completions"
MODES = ("pass", "force", "continuous")
Fetch = Callable[[bytes], Awaitable[tuple[bytes, str | None]]]  # body -> (read, stream id)


def chat(asked: bool) -> bytes:
    body: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user"}]}
    if asked:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def fetch_h1(port: int, body: bytes) -> tuple[bytes, str | None]:
    headers = [("Content-Type", "application/json")]
    response = await request(port, "POST", CHAT, body=body, headers=headers)
    try:
        return await asyncio.wait_for(response.body(), 20), response.header("sidestream-stream-id")
    finally:
        response.close()


# -- the property: generated framings over HTTP/1.1 --------------------------------------------


@pytest.fixture(scope="module")
def h1_stack() -> Iterator[tuple[asyncio.AbstractEventLoop, ScriptedServer, dict[str, int]]]:
    """A raw upstream and a sidecar per usage mode in front of it, on a loop in a thread of
    their own (hypothesis drives the test synchronously); `ports` has "direct" too."""
    ready, box = threading.Event(), {}
    server = ScriptedServer()

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"], box["loop"] = stop, asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            raw = await stack.enter_async_context(RawUpstream(raw_handler(server)).running())
            ports = {"direct": raw.port}
            for mode in MODES:
                flags = ["--upstream", f"http://127.0.0.1:{raw.port}", "--usage", mode]
                guard = build_guard(
                    load([*flags, "--keepalive-interval", "off"], {}), StreamRegistry()
                )
                ports[mode] = await stack.enter_async_context(serve(guard, "sidecar"))
            box["ports"] = ports
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(20)
    yield box["loop"], server, box["ports"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(20)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(script=scripts())
def test_any_framing_reads_the_same_through_the_sidecar_in_every_mode(
    h1_stack: tuple[asyncio.AbstractEventLoop, ScriptedServer, dict[str, int]], script: Script
) -> None:
    """Property: a client that did not ask reads the upstream's unforced bytes in all three
    modes, as directly; one that asked reads the upstream's bytes with usage, as directly."""
    loop, server, ports = h1_stack
    server.script = script

    def read(port: int, asked: bool) -> bytes:
        return asyncio.run_coroutine_threadsafe(fetch_h1(port, chat(asked)), loop).result(30)[0]

    for asked in (False, True):
        direct = read(ports["direct"], asked)
        assert direct == script.stream(asked, False)
        for mode in MODES:
            assert read(ports[mode], asked) == direct, (mode, asked)


# -- the features, each with the named quirks ---------------------------------------------------


def self_signed(directory: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (the sidecar is told not to check it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = directory / "up.pem", directory / "up.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(certfile), str(keyfile)


@contextlib.asynccontextmanager
async def upstream_of(feature: str, server: ScriptedServer, tmp: Path) -> AsyncIterator[str]:
    """The scripted server as the feature's upstream: its URL for `--upstream`."""
    if feature == "h2c-upstream":
        async with serve(server, "hypercorn") as port:
            yield f"h2c://127.0.0.1:{port}"
    elif feature == "https-upstream":
        certfile, keyfile = self_signed(tmp)
        tls = {"certfile": certfile, "keyfile": keyfile, "alpn_protocols": ["h2", "http/1.1"]}
        async with serve(server, "hypercorn", **tls) as port:
            yield f"https://127.0.0.1:{port}"
    else:
        async with RawUpstream(raw_handler(server)).running() as raw:
            yield f"http://127.0.0.1:{raw.port}"


@dataclass
class Front:
    """What the client speaks to: how it reads a stream, and the HTTP/1.1 port (resume's)."""

    fetch: Fetch
    port: int | None = None


@contextlib.asynccontextmanager
async def front(
    feature: str, mode: str, upstream: str, server: ScriptedServer
) -> AsyncIterator[Front]:
    """The sidecar as the feature wants it, in `mode`; or, for the middleware, StreamGuard
    in front of the scripted server itself."""
    if feature == "middleware":
        async with serve(StreamGuard(server, usage=mode, keepalive_interval=None)) as port:
            yield Front(lambda body: fetch_h1(port, body), port)
        return
    flags = ["--upstream", upstream, "--usage", mode, "--keepalive-interval", "off"]
    flags += {"resume": ["--resume"], "https-upstream": ["--upstream-insecure"]}.get(feature, [])
    if feature != "h2-downstream":
        guard = build_guard(load(flags, {}), StreamRegistry())
        async with serve(guard, "sidecar") as port:
            yield Front(lambda body: fetch_h1(port, body), port)
        return
    sidecar = load(["--http2", *flags], {})
    listener = HypercornListener(build_guard(sidecar, StreamRegistry()), sidecar, bound_socket())
    task = asyncio.create_task(listener.serve())
    try:
        for _ in range(400):  # `port` is the bound one once it serves
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
                writer.close()
                break
            await asyncio.sleep(0.005)
        async with H2Client(listener.port).connected() as client:

            async def fetch_h2(body: bytes) -> tuple[bytes, str | None]:
                headers = [("content-type", "application/json")]
                stream = client.request(CHAT, "POST", headers, body)
                await asyncio.wait_for(stream.ended.wait(), 20)
                assert stream.status == 200
                return stream.body, None

            yield Front(fetch_h2)
    finally:
        listener.should_exit = True
        await asyncio.wait_for(task, 10)


async def stored(port: int, stream_id: str) -> bytes:
    """A finished stream's stored events, replayed from the start."""
    response = await request(port, "GET", f"/sidestream/v1/streams/{stream_id}?after=0")
    try:
        assert response.status == 200
        return await asyncio.wait_for(response.body(), 10)
    finally:
        response.close()


FEATURES = ["resume", "middleware", "h2-downstream", "h2c-upstream", "https-upstream"]


@pytest.mark.parametrize("feature", FEATURES)
async def test_every_quirk_reads_the_same_with_the_feature_on(feature: str, tmp_path: Path) -> None:
    """With each feature on, every named quirk reads alike in the three modes: the unforced
    stream for a client that did not ask, the server's own for one that asked. With resume,
    the modes' streams are stamped alike (the stream id aside), their events are the
    upstream's, and the stored events replay as the events the client read."""
    server = ScriptedServer()
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(upstream_of(feature, server, tmp_path))
        fronts = {
            m: await stack.enter_async_context(front(feature, m, upstream, server)) for m in MODES
        }
        for name, script in QUIRKS.items():
            server.script = script
            for asked in (False, True):
                expected = script.stream(asked, False)
                reads = {}
                for mode, at in fronts.items():
                    got, stream_id = await at.fetch(chat(asked))
                    if feature == "resume":
                        assert stream_id is not None and at.port is not None
                        assert parse(await stored(at.port, stream_id)) == parse(got)
                        got = got.replace(stream_id.encode(), b"<stream>")
                    reads[mode] = got
                if feature == "resume":
                    data = [event[1] for event in parse(reads["pass"])]
                    assert data == [event[1] for event in parse(expected)], name
                    expected = reads["pass"]
                assert reads == dict.fromkeys(MODES, expected), (name, asked)


async def test_usage_beside_a_choice_reaches_the_client_as_sent_and_is_counted() -> None:
    """A server that puts its usage on the finish chunk, beside the choice: what forcing
    caused there cannot be taken out exactly, so that chunk reaches the client as the server
    sent it (the other chunks' null members still go), and
    `sidestream.usage.unchanged_chunks` counts it, once per such stream."""
    script = Script(usage_on_finish=True)
    server = ScriptedServer(script)
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])

    def unchanged() -> int:
        (metric,) = [m for m in telemetry.metrics() if m.name == METRIC_USAGE_UNCHANGED]
        return int(metric.data.data_points[0].value)  # type: ignore[union-attr]

    async with RawUpstream(raw_handler(server)).running() as raw:
        flags = ["--upstream", f"http://127.0.0.1:{raw.port}", "--keepalive-interval", "off"]
        guard = build_guard(load(flags, {}), StreamRegistry(), telemetry)
        async with serve(guard, "sidecar") as port:
            before = unchanged()
            for _ in range(2):
                got, _ = await fetch_h1(port, chat(False))
                assert got == script.stream(True, False).replace(b',"usage":null', b"")
                assert b'"finish_reason":"stop"}],"usage":{' in got
    assert unchanged() == before + 2
