"""Request trailers are bounded and kept apart (issue 56, item 2), on both listeners.

The sidecar here is what `python -m sidecar` builds (`build_guard` from parsed settings),
served as it serves it: uvicorn with the traffic protocol, or hypercorn with `--http2`. In
front of an upstream that records every byte it receives and parses them with h11 (strict),
so a trailer turned into a header, or forwarded as a trailer, would show there. The proxy
forwards no request trailers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import struct
import weakref
from collections.abc import AsyncIterator
from typing import Any

import h11
import pytest

from middleware.registry import StreamRegistry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.servers.hypercorn_listener import HypercornListener
from sidecar.servers.uvicorn_listener import traffic_protocol
from tests.support.clients import connection
from tests.support.h2peers import ClientStream, H2Client
from tests.support.servers import bound_socket, serve, wait_listening
from tests.support.upstreams import RawConnection, RawUpstream

LISTENERS = ("uvicorn", "hypercorn")
MAX_HEADER_BYTES = 4096
BOUND = 5.0  # seconds any answer here may take; each comes at once when the rule holds
CHAT = b"/v1/chat/completions"  # forced usage reads this body before the proxy reads headers
OTHER = b"/v1/other"  # the proxy reads the headers and streams the body upstream
HOSTILE = b"Authorization: Bearer stolen\r\nX-User-Id: admin\r\nX-Forwarded-For: 6.6.6.6\r\n"


class Recorder:
    """A raw upstream that keeps each connection's bytes, reads requests with h11 and answers
    each whole one with a small JSON 200 (but `/v1/hold`: never)."""

    def __init__(self) -> None:
        self.streams: list[bytearray] = []
        self.requests: list[h11.Request] = []
        self.trailers: list[list[tuple[bytes, bytes]]] = []
        self.head_seen = asyncio.Event()
        self.raw = RawUpstream(self._serve)

    async def _serve(self, conn: RawConnection) -> None:
        received = bytearray()
        self.streams.append(received)
        parser = h11.Connection(h11.SERVER)
        while data := await conn.reader.read(65536):
            received += data
            parser.receive_data(data)
            while (event := parser.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                if isinstance(event, h11.Request):
                    self.requests.append(event)
                    self.head_seen.set()
                elif isinstance(event, h11.EndOfMessage):
                    self.trailers.append(list(event.headers.raw_items()))
                    if self.requests[-1].target == b"/v1/hold":
                        continue  # never answered
                    body = b'{"ok":true}'
                    length = [(b"content-type", b"application/json"), (b"content-length", b"11")]
                    out = parser.send(h11.Response(status_code=200, headers=length))
                    out += parser.send(h11.Data(data=body)) + parser.send(h11.EndOfMessage())
                    conn.writer.write(out)
                    parser.start_next_cycle()

    def everything(self) -> bytes:
        return b"".join(bytes(stream) for stream in self.streams)


@pytest.fixture
async def upstream() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    async with recorder.raw.running():
        yield recorder


@contextlib.asynccontextmanager
async def sidecar(
    listener: str, upstream_port: int, *flags: str, registry: StreamRegistry | None = None
) -> AsyncIterator[int]:
    """The sidecar's app on its traffic listener, as `sidecar.app` serves it."""
    argv = ["--upstream", f"http://127.0.0.1:{upstream_port}", "--keepalive-interval", "off"]
    argv += ["--max-header-bytes", str(MAX_HEADER_BYTES), *flags]
    if listener == "hypercorn":
        argv.append("--http2")
    settings = load(argv, environ={})
    app = build_guard(settings, registry or StreamRegistry())
    if listener == "uvicorn":
        async with serve(app, "sidecar", http=traffic_protocol(settings)) as port:
            yield port
        return
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    hypercorn = HypercornListener(app, settings, sock)
    task = asyncio.create_task(hypercorn.serve())
    try:
        await wait_listening(port)
        yield port
    finally:
        hypercorn.should_exit = True
        await asyncio.wait_for(task, 10)


def chunked_head(path: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: client.example\r\nTransfer-Encoding: chunked\r\n\r\n" % path


BODY = b'{"stream": true}'
FIRST_CHUNK = b"%x\r\n%s\r\n" % (len(BODY), BODY)


async def answer(reader: asyncio.StreamReader, start: bytes = b"") -> tuple[int | None, bytes]:
    """The status and everything the sidecar sent (after `start`, read already) until it
    closed (a reset ends it too)."""
    data = start
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), BOUND):
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    return status, data


@pytest.mark.parametrize("path", [CHAT, OTHER], ids=["forced-usage-path", "plain-path"])
@pytest.mark.parametrize("listener", LISTENERS)
async def test_trailers_never_reach_the_upstream_as_headers(
    upstream: Recorder, listener: str, path: bytes
) -> None:
    """Trailer fields that come in the head's packet (the issue's attack: they were merged
    into the headers, and forwarded as `Authorization`, `X-User-Id`, `X-Forwarded-For`) are
    dropped: the upstream gets one request whose headers are the client's head only, and no
    trailers; the client gets the upstream's answer."""
    async with sidecar(listener, upstream.raw.port) as port, connection(port) as (reader, writer):
        writer.write(chunked_head(path) + FIRST_CHUNK + b"0\r\n" + HOSTILE + b"\r\n")
        response = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), BOUND)
    assert response.startswith(b"HTTP/1.1 200 ")
    assert len(upstream.requests) == 1
    headers = {name.lower(): value for name, value in upstream.requests[0].headers.raw_items()}
    assert b"authorization" not in headers and b"x-user-id" not in headers
    assert headers[b"x-forwarded-for"] == b"127.0.0.1"
    assert upstream.trailers == [[]]
    sent = upstream.everything().lower()
    assert b"stolen" not in sent and b"6.6.6.6" not in sent and b"x-user-id" not in sent


READ = 1 << 18  # past what either server reads at once (asyncio, uvloop: 256 KiB at most)
ONE_FIELD = b"X-Big: " + b"a" * READ + b"\r\n\r\n"
MANY_FIELDS = b"X-A: bbbbbbbbbbbbbbbb\r\n" * (READ // 16) + b"\r\n"


@pytest.mark.parametrize("trailers", [ONE_FIELD, MANY_FIELDS], ids=["one-field", "many-fields"])
@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_trailer_block_past_the_header_limit_closes_the_connection(
    upstream: Recorder, listener: str, trailers: bytes
) -> None:
    """A trailer block far past `--max-header-bytes`, sent with the body in one write, ends
    the connection at once (431, which a reset may overtake: the sidecar closes with the
    rest unread), and none of it reaches the upstream."""
    async with sidecar(listener, upstream.raw.port) as port, connection(port) as (reader, writer):
        writer.write(chunked_head(CHAT) + FIRST_CHUNK + b"0\r\n" + trailers)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        status, _ = await answer(reader)
    assert status in (431, None)
    assert upstream.requests == []


async def test_the_traffic_protocol_counts_trailer_bytes_to_the_limit(upstream: Recorder) -> None:
    """On the HTTP/1.1 listener a trailer block a little past `--max-header-bytes` is 431
    (hypercorn, with `--http2`, drops whole a block that arrives in one read, and refuses one
    that does not: the test above)."""
    trailers = b"X-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n"
    async with sidecar("uvicorn", upstream.raw.port) as port, connection(port) as (reader, writer):
        writer.write(chunked_head(CHAT) + FIRST_CHUNK + b"0\r\n" + trailers)
        status, data = await answer(reader)
    assert status == 431
    error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_header_fields_too_large"
    assert upstream.requests == []


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_trailer_field_that_never_ends_is_refused_at_the_limit(
    upstream: Recorder, listener: str
) -> None:
    """One trailer field sent a kilobyte at a time and never finished, after the upstream has
    the request's head (so later reads hold trailer bytes alone): refused once the block
    passes `--max-header-bytes` (431, closed), not held until the field ends or the body's
    deadline (60 s here) falls."""
    async with sidecar(listener, upstream.raw.port) as port, connection(port) as (reader, writer):
        writer.write(chunked_head(OTHER) + FIRST_CHUNK + b"0\r\nX-Big: ")
        await asyncio.wait_for(upstream.head_seen.wait(), BOUND)
        first = b""
        for _ in range(4 * MAX_HEADER_BYTES // 1024):
            writer.write(b"a" * 1024)
            with contextlib.suppress(TimeoutError):  # the pace of the trickle, and its end
                first = await asyncio.wait_for(reader.read(1), 0.02)
                break  # the sidecar answered: nothing more is written
        assert first, "no answer while the trailer grew past the limit"
        status, _ = await answer(reader, first)
    assert status == 431
    assert b"x-big" not in upstream.everything().lower()


async def test_a_closed_connections_protocol_is_freed_by_reference_counts_alone(
    upstream: Recorder,
) -> None:
    """A closed connection's objects do not wait for the cyclic collector: with it off, the
    traffic protocol is freed once the connection is lost, for a connection refused for its
    trailers, one reset by its client after a kept-alive answer (uvicorn keeps its keep-alive
    timer then, for 5 s), one whose body was cut off on its way up, and one closed with a
    request pipelined behind one the upstream holds (never started: its extension holds the
    connection until the connection lets go of it)."""
    settings = load(["--upstream", f"http://127.0.0.1:{upstream.raw.port}"], environ={})
    protocols: list[weakref.ref[Any]] = []
    base = traffic_protocol(settings)

    class Watched(base):  # type: ignore[valid-type,misc]
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            protocols.append(weakref.ref(self))

    async def upstream_has(raw: bytes) -> None:
        """Send `raw` and close once the upstream has its (first) request's head."""
        upstream.head_seen.clear()
        async with connection(port) as (_, writer):
            writer.write(raw)
            await asyncio.wait_for(upstream.head_seen.wait(), BOUND)

    app = build_guard(settings, StreamRegistry())
    async with serve(app, "sidecar", http=Watched) as port:
        gc.collect()
        gc.disable()
        try:
            async with connection(port) as (reader, writer):
                writer.write(chunked_head(CHAT) + FIRST_CHUNK + b"0\r\n" + ONE_FIELD)
                await answer(reader)  # 431, closed
            async with connection(port) as (reader, writer):
                writer.write(chunked_head(OTHER) + FIRST_CHUNK + b"0\r\n\r\n")
                await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), BOUND)  # kept alive
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await upstream_has(b"POST /v1/other HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{")
            held = b"GET /v1/hold HTTP/1.1\r\nHost: x\r\n\r\n"
            await upstream_has(held + b"GET /v1/other HTTP/1.1\r\nHost: x\r\n\r\n")
            for _ in range(200):  # until each connection's loss has run, well within 5 s
                if all(ref() is None for ref in protocols):
                    break
                await asyncio.sleep(0.01)
            alive = [ref() for ref in protocols if ref() is not None]
        finally:
            gc.enable()
    assert len(protocols) == 4
    assert alive == [], f"{len(alive)} closed connections still held"


async def h2_request_with_trailers(
    port: int, trailers: list[tuple[bytes, bytes]]
) -> tuple[ClientStream, H2Client]:
    """A chat POST over h2c whose body is followed by a trailer block (HEADERS with
    END_STREAM); the stream once it ended or was reset, or the connection closed."""
    client = H2Client(port)
    async with client.connected():
        stream_id = client.conn.get_next_available_stream_id()
        stream = client.streams[stream_id] = ClientStream(stream_id)
        head = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", CHAT)]
        head += [(b":authority", b"client.example"), (b"content-type", b"application/json")]
        client.conn.send_headers(stream_id, head)
        client.conn.send_data(stream_id, BODY)
        client.conn.send_headers(stream_id, trailers, end_stream=True)
        client._flush()  # what `H2Client.request` does after its frames
        ended = asyncio.create_task(stream.ended.wait())
        closed = asyncio.create_task(client.closed.wait())
        await asyncio.wait((ended, closed), timeout=BOUND, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        closed.cancel()
    return stream, client


async def test_http2_trailers_never_reach_the_upstream(upstream: Recorder) -> None:
    """With `--http2`, an h2c request's trailers (a HEADERS frame after the body) are not
    forwarded, as headers or otherwise: the upstream gets the client's head only."""
    hostile = [(b"authorization", b"Bearer stolen"), (b"x-forwarded-for", b"6.6.6.6")]
    async with sidecar("hypercorn", upstream.raw.port) as port:
        stream, _ = await h2_request_with_trailers(port, hostile)
    assert stream.status == 200 and stream.body == b'{"ok":true}'
    assert len(upstream.requests) == 1
    headers = dict(upstream.requests[0].headers.raw_items())
    assert b"authorization" not in headers and headers[b"x-forwarded-for"] == b"127.0.0.1"
    assert upstream.trailers == [[]]
    assert b"stolen" not in upstream.everything() and b"6.6.6.6" not in upstream.everything()


async def test_an_http2_trailer_block_past_the_header_list_limit_is_refused(
    upstream: Recorder,
) -> None:
    """An h2c trailer block larger than the header list size the sidecar allows (hypercorn's
    `h2_max_header_list_size`, set from `--max-header-bytes`) ends the stream or the
    connection, and none of it reaches the upstream."""
    big = [(b"x-big-%d" % i, b"a" * 1000) for i in range(100)]  # ~100 KB
    async with sidecar("hypercorn", upstream.raw.port) as port:
        stream, client = await h2_request_with_trailers(port, big)
    assert stream.status != 200
    assert stream.reset_code is not None or client.closed.is_set()
    assert b"x-big" not in upstream.everything()
