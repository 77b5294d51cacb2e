"""The HTTP/2 flood bounds of `sidecar.servers.hypercorn_internals`, one by one: the sliding
window and the sorting of h2 events (pure), then the `--http2` listener (hypercorn, in this
process) in front of an app of the test's own, at each limit and one past it.

The process-level tests, with the real CLI, an upstream, an honest stream and RSS, are in
tests/system/test_h2_floods.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import h2.errors
import h2.events as h2e
import pytest

from middleware.types import Receive, Scope, Send
from sidecar.config import load
from sidecar.servers import hypercorn_internals
from sidecar.servers.hypercorn_internals import (
    CONTROL_FRAME_LIMIT,
    RAPID_RESET_LIMIT,
    Floods,
    Window,
    close_in_time,
    guard_h2_floods,
)
from sidecar.servers.hypercorn_listener import HypercornListener
from tests.support.h2peers import (
    PING,
    PRIORITY,
    WINDOW_UPDATE,
    H2Client,
    client_preface,
    frame,
    goaway_codes,
)
from tests.support.servers import bound_socket, wait_listening

CAP = 100  # the listener's h2_max_concurrent_streams
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
REFUSED = h2.errors.ErrorCodes.REFUSED_STREAM


# --- pure ------------------------------------------------------------------------------------


def test_a_window_allows_its_limit_and_no_more() -> None:
    """Rule: `limit` events within `seconds` are allowed, the next one within them is over;
    once the oldest has left the window, one more is allowed again."""
    window = Window(3, 10.0)
    assert [window.over(t) for t in (0.0, 1.0, 2.0)] == [False, False, False]
    assert window.over(5.0)  # a fourth within 10 s of the first
    assert not window.over(11.5)  # the last three: 2.0, 5.0, 11.5
    assert window.over(11.9)


def requested(stream: int) -> h2e.RequestReceived:
    return h2e.RequestReceived(stream_id=stream, headers=[])


def reset(stream: int, remote: bool = True) -> h2e.StreamReset:
    return h2e.StreamReset(stream_id=stream, error_code=8, remote_reset=remote)


def test_a_new_stream_past_the_cap_is_refused_with_the_rest_of_it() -> None:
    """Rule: with `cap` apps running (those started in the same batch included) a new
    stream is refused, its other events dropped; a refusal counts like a client's reset."""
    body = h2e.DataReceived(stream_id=5, data=b"x")
    ended = h2e.StreamEnded(stream_id=5)
    events = [requested(3), requested(5), body, ended, h2e.PingReceived(ping_data=b"12345678")]
    kept, refused, why = Floods().sort(events, running=CAP - 1, cap=CAP, now=0.0)
    assert kept == [events[0], events[4]] and refused == [5] and why == ""
    floods = Floods()
    for stream in range(1, 2 * RAPID_RESET_LIMIT, 2):
        assert floods.sort([requested(stream)], CAP, CAP, 0.0)[2] == ""
    assert "reset or refused" in floods.sort([requested(999)], CAP, CAP, 0.0)[2]


def test_the_reset_past_the_limit_ends_the_batch_there() -> None:
    """Rule: RAPID_RESET_LIMIT resets by the client within the window pass; the next ends
    the connection, and the events after it are not handled. Resets h2 made itself (a
    client's protocol error on one stream) are not counted."""
    floods = Floods()
    ours = [reset(s, remote=False) for s in range(1, 400, 2)]
    theirs = [reset(s) for s in range(401, 401 + 2 * RAPID_RESET_LIMIT, 2)]
    kept, _, why = floods.sort(ours + theirs, running=0, cap=CAP, now=0.0)
    assert why == "" and len(kept) == len(ours) + RAPID_RESET_LIMIT
    after = requested(9999)
    kept, _, why = floods.sort([reset(8001), after], running=0, cap=CAP, now=1.0)
    assert kept == [kept[0]] and after not in kept
    assert why == f"more than {RAPID_RESET_LIMIT} streams reset or refused within 10 s"
    later = Floods()
    later.sort(theirs, running=0, cap=CAP, now=0.0)
    assert later.sort([reset(8001)], running=0, cap=CAP, now=10.5)[2] == ""  # window moved


def test_ping_settings_and_priority_frames_share_the_control_limit() -> None:
    """Rule: PING, SETTINGS and PRIORITY frames count together; CONTROL_FRAME_LIMIT of them
    within the window pass, the next ends the connection. ACKs do not count, nor does the
    priority a HEADERS frame carries for the stream it opens."""
    priority = h2e.PriorityUpdated()
    priority.stream_id = 3
    kinds = [
        h2e.PingReceived(ping_data=b"12345678"),
        h2e.RemoteSettingsChanged(),
        priority,
        h2e.PingAckReceived(ping_data=b"12345678"),
        h2e.SettingsAcknowledged(),
    ]
    floods = Floods()
    events = [kinds[i % 3] for i in range(CONTROL_FRAME_LIMIT)] + kinds[3:] * 50
    assert floods.sort(events, running=0, cap=CAP, now=0.0)[2] == ""
    headers_with_priority = [requested(3), priority]  # what h2 makes of one such HEADERS
    assert floods.sort(headers_with_priority, running=0, cap=CAP, now=0.0)[2] == ""
    assert "PING, SETTINGS or PRIORITY" in floods.sort(kinds[:1], 0, CAP, 0.0)[2]


# --- the listener ----------------------------------------------------------------------------


class App:
    """`/hold`: runs until `release` is set, deaf to the disconnect (an app slow to notice
    it); `/wait`: runs until the disconnect; anything else: `ok`. Counts the apps running."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.release = asyncio.Event()
        self.changed = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.changed.set()
        try:
            if scope["path"] == "/hold":
                await self.release.wait()
            elif scope["path"] == "/wait":
                while (await receive())["type"] != "http.disconnect":
                    pass
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        finally:
            self.running -= 1
            self.changed.set()

    async def until(self, running: int) -> None:
        async with asyncio.timeout(10):
            while self.running != running:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def listening(app: App, *flags: str, sndbuf: int = 0) -> AsyncIterator[int]:
    """The `--http2` listener serving `app`; yields its port. `sndbuf`: the send buffer of
    each connection's socket (0: the system's)."""
    settings = load(["--http2", "--upstream", "http://127.0.0.1:9", *flags], {})
    sock = bound_socket()
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)  # accepted ones inherit it
    port = int(sock.getsockname()[1])
    listener = HypercornListener(app, settings, sock)
    task = asyncio.create_task(listener.serve())
    try:
        await wait_listening(port)
        yield port
    finally:
        app.release.set()
        listener.should_exit = True
        await asyncio.wait_for(task, 10)


class Client(H2Client):
    """H2Client that keeps the GOAWAY it was sent."""

    goaway: int | None = None

    def _on(self, event: h2e.Event) -> None:
        if isinstance(event, h2e.ConnectionTerminated):
            self.goaway = event.error_code
        super()._on(event)


async def ok(client: Client) -> bool:
    stream = client.request("/")
    await asyncio.wait_for(stream.ended.wait(), 10)
    return stream.status == 200 and stream.body == b"ok"


async def test_apps_still_running_are_capped_at_max_concurrent_streams() -> None:
    """Rule: a stream the client reset still counts while its app runs: with CAP apps
    running on a connection a new stream gets RST_STREAM(REFUSED_STREAM) and starts no app;
    once they end, new streams are served again."""
    app = App()
    async with listening(app) as port, Client(port).connected() as client:
        held = [client.request("/hold") for _ in range(CAP)]
        await app.until(CAP)
        for stream in held[: CAP // 2]:
            client.reset(stream)
        refused = client.request("/")
        await asyncio.wait_for(refused.ended.wait(), 10)
        assert refused.reset_code == REFUSED and app.peak == CAP
        app.release.set()
        await app.until(0)
        assert await ok(client) and client.goaway is None


async def reset_streams(client: Client, app: App, count: int) -> None:
    """Open `count` streams whose apps wait for the disconnect, then reset them all."""
    streams = [client.request("/wait") for _ in range(count)]
    await app.until(count)
    for stream in streams:
        client.reset(stream)
    await app.until(0)


async def test_resets_past_the_limit_end_the_connection_with_goaway() -> None:
    """Rule: RAPID_RESET_LIMIT streams reset within the window leave the connection
    serving; one more ends it with GOAWAY(ENHANCE_YOUR_CALM)."""
    app = App()
    async with listening(app) as port, Client(port).connected() as client:
        for _ in range(RAPID_RESET_LIMIT // 50):
            await reset_streams(client, app, 50)
        assert await ok(client) and client.goaway is None
        await reset_streams(client, app, 1)
        await asyncio.wait_for(client.closed.wait(), 10)
    assert client.goaway == CALM


async def test_pings_past_the_limit_end_the_connection_with_goaway() -> None:
    """Rule: CONTROL_FRAME_LIMIT control frames within the window (the client's first
    SETTINGS among them) are answered; one more ends the connection with
    GOAWAY(ENHANCE_YOUR_CALM)."""
    app = App()
    async with listening(app) as port, Client(port).connected() as client:
        for i in range(CONTROL_FRAME_LIMIT - 1):
            client.conn.ping(i.to_bytes(8, "big"))
        assert await ok(client) and client.goaway is None
        client.conn.ping(b"12345678")
        client.request("/")  # flushes the PING
        await asyncio.wait_for(client.closed.wait(), 10)
    assert client.goaway == CALM


async def test_priority_for_streams_that_never_open_ends_the_connection_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule: PRIORITY frames naming thousands of streams that never open end the connection
    with GOAWAY(ENHANCE_YOUR_CALM), never with hypercorn's unhandled TooManyStreamsError (a
    traceback in the log)."""
    app = App()
    priorities = b"".join(frame(PRIORITY, 0, s, b"\0\0\0\0\x10") for s in range(1, 6001, 2))
    with caplog.at_level(logging.WARNING):
        async with listening(app) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(client_preface() + priorities)
            received = b""
            async with asyncio.timeout(10):
                with contextlib.suppress(ConnectionError):
                    while data := await reader.read(65536):
                        received += data
            writer.close()
    assert goaway_codes(received) == [CALM]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def until_reset(sock: socket.socket) -> None:
    """Keep sending frames that cost the sidecar nothing (connection WINDOW_UPDATE, +1), and
    read nothing, until the connection is reset: bytes it left unread make the sidecar's
    close a reset."""
    loop = asyncio.get_running_loop()
    filler = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")) * 100
    sock.setblocking(False)
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(10):
            while True:
                await loop.sock_sendall(sock, filler)
                await asyncio.sleep(0.01)  # a client with more to say, not a flood


def unread_client(port: int) -> socket.socket:
    """A client socket with the smallest receive buffer, that will read nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    return sock


@pytest.mark.parametrize(
    ("pings", "flags"),
    [(CONTROL_FRAME_LIMIT + 500, ()), (900, ("--header-timeout", "0.5"))],
    ids=["after-goaway", "after-header-timeout"],
)
async def test_a_close_the_peer_never_reads_is_aborted_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, pings: int, flags: tuple[str, ...]
) -> None:
    """Rule: hypercorn closes a connection by sending what is queued first; a peer that
    reads nothing is aborted (reset) CLOSE_GRACE after the close began: after the GOAWAY of
    a PING flood, or after `--header-timeout` on an idle connection whose ACKs it left
    unread."""
    monkeypatch.setattr(hypercorn_internals, "CLOSE_GRACE", 0.5)
    app = App()
    async with listening(app, *flags, sndbuf=4096) as port:
        sock = unread_client(port)
        try:
            sock.sendall(client_preface() + frame(PING, 0, 0, b"12345678") * pings)
            await until_reset(sock)
        finally:
            sock.close()


def test_the_flood_guards_stay_off_when_the_gate_says_no(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: on a hypercorn release nobody checked, neither patch is applied: each says so in
    one warning line and leaves hypercorn's methods as they are."""
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.protocol.h2 import H2Protocol

    monkeypatch.setattr(hypercorn_internals, "installed", lambda: "99.0.0")
    monkeypatch.setattr(H2Protocol, "sidestream_guarded", False, raising=False)
    monkeypatch.setattr(TCPServer, "sidestream_close_in_time", False, raising=False)
    before: Any = (H2Protocol._handle_events, TCPServer._close)
    with caplog.at_level(logging.WARNING, logger="sidestream"):
        assert not guard_h2_floods() and not close_in_time()
    assert (H2Protocol._handle_events, TCPServer._close) == before
    assert len([r for r in caplog.records if "99.0.0" in r.message]) == 2
