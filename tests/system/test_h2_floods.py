"""HTTP/2 floods against the real CLI, `python -m sidecar --http2` (h2c), issue 48 item 4:
rapid reset (CVE-2023-44487), a header block that never ends (CVE-2024-27316 family), and
PING and SETTINGS floods from a client that never reads.

Each flood runs on its own connection while an honest SSE stream runs on another. Each must
end with that connection closed by a GOAWAY naming the rule, within `ATTACK` seconds; the
honest stream's tokens arrive within `LATE` of the upstream writing them, and it completes;
the process lives on and serves; its peak RSS (VmHWM, from /proc) rises by less than
`RSS_BOUND`. The upstream is this file's own HTTP/1.1 server, which counts the requests the
sidecar holds open on it: a rapid reset that got through would show there.

The bounds are `sidecar/servers/hypercorn_internals.py`'s (and h2's CONTINUATION bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.errors
import pytest

from sidecar.servers.hypercorn_internals import RAPID_RESET_LIMIT
from tests.support.h2peers import (
    CONTINUATION,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    H2Client,
    client_preface,
    frame,
    goaway_codes,
    parse_frames,
    request_block,
)
from tests.support.procs import Child, get

MiB = 1024 * 1024
RSS_BOUND = 32 * MiB
ATTACK = 5.0  # seconds a flood is given; the sidecar must close its connection sooner
SUSTAINED = 3.0  # seconds a client comes back on new connections
LATE = 2.0  # seconds an honest token may trail the upstream's write of it, under attack
MAX_STREAMS = 100  # hypercorn_listener's h2_max_concurrent_streams: apps per connection
TOKENS, ITL = 100, 0.05  # the honest stream: 5 s, longer than any flood
CALM, PROTOCOL_ERROR = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, h2.errors.ErrorCodes.PROTOCOL_ERROR


@dataclass
class CountingUpstream:
    """HTTP/1.1. `/hold`: an SSE head and one event, then nothing until the sidecar closes
    the connection; `open` counts those held now, `peak` the most at once, `total` all.
    `/tokens`: TOKENS events `data: <i>`, ITL apart, then `data: [DONE]`; `written[i]` is
    when event i was written. Anything else: `ok`."""

    open: int = 0
    peak: int = 0
    total: int = 0
    written: dict[int, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        try:
            path = (await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)[1]
            if path not in (b"/hold", b"/tokens"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                return
            writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
            if path == b"/hold":
                await self._hold(reader, writer)
            else:
                await self._tokens(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open, self.total = self.open + 1, self.total + 1
        self.peak = max(self.peak, self.open)
        try:
            writer.write(b"9\r\ndata: 0\n\n\r\n")
            await reader.read()  # until the sidecar closes it
        finally:
            self.open -= 1
            self.changed.set()

    async def _tokens(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        for i in range(TOKENS):
            event = f"data: {i}\n\n".encode()
            self.written[i] = loop.time()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(ITL)
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[CountingUpstream, int]]:
    counting = CountingUpstream()
    server = await asyncio.start_server(counting.serve, "127.0.0.1", 0)
    try:
        yield counting, server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.fixture
async def sidecar(upstream: tuple[CountingUpstream, int]) -> AsyncIterator[Child]:
    child = Child(upstream[1], "--http2")
    try:
        await child.ready()
        yield child
    finally:
        child.kill()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


class Peer:
    """A raw client socket. Unlike asyncio's streams, a failed write does not throw away what
    the sidecar sent before it closed the connection: that stays readable, GOAWAY included."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.loop = asyncio.get_running_loop()
        self.received = b""
        self.closed = False  # the sidecar ended the connection before ATTACK ran out

    async def send(self, data: bytes) -> bool:
        """Send all of `data`; False when the sidecar has closed the connection."""
        try:
            await self.loop.sock_sendall(self.sock, data)
        except ConnectionError:
            return False
        return True

    async def read(self) -> bytes:
        """The next bytes the sidecar sent; b"" at the end (closed or reset)."""
        with contextlib.suppress(ConnectionError):
            data = await self.loop.sock_recv(self.sock, 65536)
            self.received += data
            return data
        return b""


async def under_attack(
    child: Child, upstream: CountingUpstream, attack: Callable[[int], Awaitable[Peer]]
) -> Peer:
    """Run `attack` while an honest stream runs on another connection; check what every
    flood must leave intact: the honest stream on time and complete, the process alive and
    serving, its peak RSS within RSS_BOUND."""
    before = peak_rss(child.process.pid)
    async with H2Client(child.port).connected() as client:
        honest = client.request("/tokens")
        await asyncio.wait_for(honest.first_data.wait(), 10)
        peer = await attack(child.port)
        await asyncio.wait_for(honest.ended.wait(), 30)
    assert child.process.poll() is None, "the sidecar died"
    rise = peak_rss(child.process.pid) - before
    assert rise < RSS_BOUND, f"peak RSS rose {rise / MiB:.1f} MiB"
    arrived: dict[int, float] = {}
    for at, data in honest.arrivals:
        for line in data.split(b"\n"):
            if line.startswith(b"data: ") and line[6:].isdigit():
                arrived[int(line[6:])] = at
    assert sorted(arrived) == list(range(TOKENS)) and honest.body.endswith(b"data: [DONE]\n\n")
    late = max(arrived[i] - upstream.written[i] for i in arrived)
    assert late < LATE, f"an honest token came {late:.2f} s after the upstream wrote it"
    status, _, body = await get(child.port, "/ok")  # a new connection is served
    assert (status, body) == (200, b"ok")
    return peer


async def flood(port: int, batch: Callable[[int], bytes], preface: bytes = b"") -> Peer:
    """Send `batch(n)` for n = 0, 1, ... as fast as the socket takes them, reading all the
    while, until the sidecar closes the connection or ATTACK runs out."""
    peer = Peer(port)

    async def read() -> None:
        while await peer.read():
            pass

    reading = asyncio.create_task(read())
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ATTACK):
                sending, n = await peer.send(client_preface() + preface), 0
                while sending and not reading.done():
                    sending, n = await peer.send(batch(n)), n + 1
                    await asyncio.sleep(0)  # the honest client shares this loop
                await reading
                peer.closed = True
    finally:
        reading.cancel()
        peer.sock.close()
    return peer


BLOCK, CANCEL = request_block("/hold"), (8).to_bytes(4, "big")


def opened(stream: int) -> bytes:
    return frame(HEADERS, END_STREAM | END_HEADERS, stream, BLOCK)


def reset_at_once(port: int) -> Awaitable[Peer]:
    """HEADERS and RST_STREAM for one stream after another, 50 pairs a write."""

    def batch(n: int) -> bytes:
        streams = range(100 * n + 1, 100 * n + 100, 2)
        return b"".join(opened(s) + frame(RST_STREAM, 0, s, CANCEL) for s in streams)

    return flood(port, batch)


async def reset_on_response(port: int) -> Peer:
    """MAX_STREAMS streams open; each reset as soon as its response HEADERS arrive (its
    upstream request has begun by then) and replaced by a new one, until the sidecar closes
    the connection or ATTACK runs out."""
    peer, parsed, next_stream = Peer(port), 0, 2 * MAX_STREAMS + 1
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ATTACK):
                await peer.send(client_preface() + b"".join(map(opened, range(1, next_stream, 2))))
                while await peer.read():
                    frames = parse_frames(peer.received[parsed:])
                    parsed += sum(9 + len(f.payload) for f in frames)
                    for stream in [f.stream for f in frames if f.kind == HEADERS]:
                        await peer.send(frame(RST_STREAM, 0, stream, CANCEL) + opened(next_stream))
                        next_stream += 2
                peer.closed = True
    finally:
        peer.sock.close()
    return peer


@pytest.mark.parametrize("attack", [reset_at_once, reset_on_response], ids=lambda a: a.__name__)
async def test_rapid_reset_is_bounded_and_ended_with_goaway(
    sidecar: Child,
    upstream: tuple[CountingUpstream, int],
    attack: Callable[[int], Awaitable[Peer]],
) -> None:
    """Rule (CVE-2023-44487): streams opened and reset as fast as a client can, each reset at
    once or as soon as its response begins, open at most MAX_STREAMS upstream requests at a
    time, all closed again; more than RAPID_RESET_LIMIT resets in the window end the
    connection with GOAWAY(ENHANCE_YOUR_CALM)."""
    counting, _ = upstream
    peer = await under_attack(sidecar, counting, attack)
    assert peer.closed and goaway_codes(peer.received) == [CALM]
    assert counting.peak <= MAX_STREAMS, counting.peak
    await counting.wait_for(lambda: counting.open == 0, 10)
    if attack is reset_on_response:  # it reached the upstream: an unbounded one would show
        assert counting.total >= MAX_STREAMS
    assert counting.total <= RAPID_RESET_LIMIT + 1 + MAX_STREAMS


async def test_rapid_reset_on_one_connection_after_another_keeps_the_bounds(
    sidecar: Child, upstream: tuple[CountingUpstream, int]
) -> None:
    """Rule: a client that comes back on a new connection each time it is sent GOAWAY, for
    SUSTAINED seconds, is sent GOAWAY(ENHANCE_YOUR_CALM) on every one, and the process's
    memory stays bounded (per-connection state is let go) with no upstream request left
    open."""
    counting, _ = upstream
    codes: list[list[int]] = []

    async def again_and_again(port: int) -> Peer:
        loop = asyncio.get_running_loop()
        end = loop.time() + SUSTAINED
        while True:
            peer = await reset_at_once(port)
            codes.append(goaway_codes(peer.received) if peer.closed else [])
            if loop.time() > end:
                return peer

    await under_attack(sidecar, counting, again_and_again)
    assert len(codes) > 1 and all(c == [CALM] for c in codes), codes
    await counting.wait_for(lambda: counting.open == 0, 10)


async def test_a_header_block_that_never_ends_is_cut_at_the_continuation_bound(
    sidecar: Child, upstream: tuple[CountingUpstream, int]
) -> None:
    """Rule (CVE-2024-27316 family): HEADERS without END_HEADERS, then CONTINUATION frames
    of 16 KiB without end: h2 ends the connection with GOAWAY(PROTOCOL_ERROR) past 64 of
    them (1 MiB), and the block never reaches the upstream."""
    counting, _ = upstream
    piece = frame(CONTINUATION, 0, 1, b"\x00" * 2**14)
    start = frame(HEADERS, END_STREAM, 1, request_block("/hold"))
    peer = await under_attack(sidecar, counting, lambda port: flood(port, lambda n: piece, start))
    assert peer.closed and goaway_codes(peer.received) == [PROTOCOL_ERROR]
    assert counting.total == 0


CONTROL = {
    "ping": frame(PING, 0, 0, b"12345678"),
    "settings": frame(SETTINGS, 0, 0, (2).to_bytes(2, "big") + (0).to_bytes(4, "big")),
}


async def never_reading(port: int, one: bytes) -> Peer:
    """Send `one` frame over and over without ever reading (a raw socket: asyncio's streams
    would read for us) until the sidecar closes the connection or ATTACK runs out; then
    read what the sidecar sent."""
    peer = Peer(port)
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ATTACK):
                sending = await peer.send(client_preface())
                while sending:
                    sending = await peer.send(one * 500)
                    await asyncio.sleep(0)  # the honest client shares this loop
                peer.closed = True
        async with asyncio.timeout(10):
            while await peer.read():
                pass
    finally:
        peer.sock.close()
    return peer


@pytest.mark.parametrize("kind", sorted(CONTROL))
async def test_a_control_frame_flood_from_a_client_that_never_reads_is_ended(
    sidecar: Child, upstream: tuple[CountingUpstream, int], kind: str
) -> None:
    """Rule: a client that sends PING (or SETTINGS) frames without end and never reads the
    ACKs is sent GOAWAY(ENHANCE_YOUR_CALM) past CONTROL_FRAME_LIMIT frames in the window and
    closed; the ACKs it left unread cost bounded memory. The GOAWAY is queued behind the ACKs
    the client never read, so it reaches the client only when the kernel's buffers let it
    before the close is cut short (`CLOSE_GRACE`): what does arrive is that GOAWAY and no
    other (the limit itself, exactly, is `test_h2_floods_unit`'s)."""
    counting, _ = upstream
    peer = await under_attack(sidecar, counting, lambda port: never_reading(port, CONTROL[kind]))
    assert peer.closed and goaway_codes(peer.received) in ([CALM], []), peer.received[-64:]
