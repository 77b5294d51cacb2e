"""Every use of hypercorn's private internals: the bounded HTTP/2 per-stream send buffer, the
idle (header) timer on h2c prior-knowledge connections, the HTTP/2 flood guards, and a
bounded close.

Checked against hypercorn 0.18.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
installed release's major.minor is one checked and the names below are still there. When it
says no, each patch leaves hypercorn as it is (the public path) and logs one line. A runtime
gate, not a bound in pyproject, because unpatched hypercorn still serves every stream
correctly: what it loses are bounds (the upstream's pause for a slow HTTP/2 client, the
flood guards), which a later hypercorn may well keep itself, while the patches rely on
private names (the buffer's `buffer`, `_paused`, `_is_empty`; those named below), which a
later release may change.

The second patch (`h2c_idle_timer()`): hypercorn's one per-connection timer,
`keep_alive_timeout` (the sidecar's `--header-timeout`), runs while a connection has no
request in progress. A cleartext connection starts on HTTP/1.1; h11 parses the h2c preface
`PRI * HTTP/2.0` as a request, so hypercorn stops the timer ("a request began") and then
switches to HTTP/2 — where nothing restarts it until a stream *ends*. A client that sends
the preface and then a header block it never finishes (or nothing at all) would hold the
connection forever. The patch wraps `ProtocolWrapper.handle`: when it has just switched to
HTTP/2 and no stream is open, it reports the connection idle (`Updated(idle=True)`), which
restarts the timer. Private names: `ProtocolWrapper.handle`, `.protocol`, `.send`;
`H2Protocol.idle`. Without it (gate says no): logged, and h2c prior-knowledge connections
have no header deadline; TLS (ALPN h2) and HTTP/1.1 keep theirs.

The third (`guard_h2_floods()`), against floods hypercorn 0.18 and h2 4.x leave open
(CVE-2023-44487 and kin). A reset stream leaves h2's count of open streams at once, but its
app, and the upstream request the app made, run on until they see the disconnect;
hypercorn's only bound is the priority tree's 1,000 streams, met by an unhandled exception
(a traceback, the connection dropped without GOAWAY). Every PING and SETTINGS costs an ACK.
So, per connection: at most `h2_max_concurrent_streams` apps run, reset streams included
(past it, a new stream gets RST_STREAM(REFUSED_STREAM)); more than `RAPID_RESET_LIMIT`
streams reset by the client or refused, or more than `CONTROL_FRAME_LIMIT` PING, SETTINGS
and PRIORITY frames, within `FLOOD_WINDOW` seconds end the connection with
GOAWAY(ENHANCE_YOUR_CALM). Private names: `H2Protocol.__init__`, `_handle_events`, `_flush`,
`.task_group`, `.connection`, `.stream_buffers`. A header block that never ends needs nothing
here: h2 ends the connection with GOAWAY(PROTOCOL_ERROR) past 64 CONTINUATION frames
(`h2.frame_buffer.CONTINUATION_BACKLOG`: 1 MiB at hypercorn's 16 KiB frames), and a slow
one meets `--header-timeout`. A client that never reads is held back by hypercorn itself:
it reads no more while its writes wait (`writer.drain()`).

The fourth (`close_in_time()`): hypercorn closes a connection with `writer.close()`, which
first sends what is queued; a peer that reads nothing takes nothing, and the socket, and
the read loop waiting for its end, would stay forever. The patch aborts a connection still
open `CLOSE_GRACE` seconds after hypercorn began to close it. Private names:
`TCPServer._close`, `_initiate_server_close`, `.writer`.

The patches are applied when the `--http2` listener starts serving, never on import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import h2.events as h2e
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError

logger = logging.getLogger("sidestream")

CHECKED = ("0.18",)  # hypercorn major.minor releases these internals were read in

FLOOD_WINDOW = 10.0  # seconds over which a connection's resets and control frames are counted
RAPID_RESET_LIMIT = 100  # streams reset by the client (or refused) per window; past it, GOAWAY
CONTROL_FRAME_LIMIT = 1000  # PING, SETTINGS and PRIORITY frames per window; past it, GOAWAY
CLOSE_GRACE = 10.0  # seconds a closing connection has to take its last bytes, then it is aborted
CONTROL_FRAMES = (h2e.PingReceived, h2e.RemoteSettingsChanged, h2e.PriorityUpdated)


def installed() -> str:
    """The installed hypercorn's version (hypercorn has no `__version__`)."""
    return importlib.metadata.version("hypercorn")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed hypercorn) one the patches were checked against,
    with the names they replace still there?"""
    from hypercorn.protocol import h2 as hyper_h2

    version = installed() if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.protocol import ProtocolWrapper

    protocol, server = hyper_h2.H2Protocol, TCPServer
    return (
        hasattr(hyper_h2, "StreamBuffer")
        and hasattr(hyper_h2, "BUFFER_LOW_WATER")
        and callable(getattr(ProtocolWrapper, "handle", None))
        and isinstance(getattr(protocol, "idle", None), property)
        and all(callable(getattr(protocol, name, None)) for name in ("_handle_events", "_flush"))
        and all(
            callable(getattr(server, name, None)) for name in ("_close", "_initiate_server_close")
        )
    )


def gate_open(lost: str) -> bool:
    """Whether the installed hypercorn is a checked release; else one warning line saying
    what a patch's absence leaves (`lost`), and False: each patch asks once, when applied."""
    if checked():
        return True
    logger.warning(
        "hypercorn %s is not a release sidestream was checked against (%s): %s",
        installed(),
        ", ".join(CHECKED),
        lost,
    )
    return False


def bound_h2_stream_buffers() -> bool:
    """Make hypercorn's per-stream HTTP/2 send buffer hold a writer back (idempotent); False
    when the gate says no and hypercorn's own buffer stays (logged).

    hypercorn 0.17-0.18 `StreamBuffer.pop` wakes a writer paused at the high-water mark when
    the chunk it *took* is small, not when what is *left* is. A client that stops opening a
    stream's window gets `pop(0)` for every write, so the app is never held back and the
    buffer grows without bound — the upstream is never paused for a slow HTTP/2 client. The
    replacement wakes the writer once the buffer is under the low-water mark.
    """
    from hypercorn.protocol import h2 as hyper_h2

    if getattr(hyper_h2.StreamBuffer, "sidestream_bounded", False):
        return True
    if not gate_open(
        "its HTTP/2 send buffer is left as is, so a slow HTTP/2 client does not pause its upstream"
    ):
        return False
    low_water = hyper_h2.BUFFER_LOW_WATER

    class StreamBuffer(hyper_h2.StreamBuffer):
        sidestream_bounded = True

        async def pop(self, max_length: int) -> bytes:
            buffer: bytearray = self.buffer
            data = bytes(buffer[:max_length])
            del buffer[:max_length]
            if len(buffer) < low_water:
                await self._paused.set()
            if not buffer:
                await self._is_empty.set()
            return data

    hyper_h2.StreamBuffer = StreamBuffer  # type: ignore[misc]
    return True


def h2c_idle_timer() -> bool:
    """Restart hypercorn's idle timer when a cleartext connection switches to HTTP/2 with no
    stream open (idempotent); False when the gate says no (logged). See the module docstring."""
    from hypercorn.events import Event, Updated
    from hypercorn.protocol import ProtocolWrapper
    from hypercorn.protocol.h2 import H2Protocol

    if getattr(ProtocolWrapper, "sidestream_h2c_idle", False):
        return True
    if not gate_open("an h2c connection (prior knowledge) gets no --header-timeout"):
        return False
    handle = ProtocolWrapper.handle

    async def handle_then_report_idle(self: ProtocolWrapper, event: Event) -> None:
        before = self.protocol
        await handle(self, event)
        after = self.protocol
        if after is not before and isinstance(after, H2Protocol) and after.idle:
            await self.send(Updated(idle=True))

    ProtocolWrapper.handle = handle_then_report_idle  # type: ignore[method-assign]
    ProtocolWrapper.sidestream_h2c_idle = True  # type: ignore[attr-defined]
    return True


class Window:
    """A sliding window: is this event one more than `limit` within `seconds`? Keeps the times
    of the last `limit` events only."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.times: deque[float] = deque(maxlen=limit)
        self.seconds = seconds

    def over(self, now: float) -> bool:
        times = self.times
        over = len(times) == times.maxlen and now - times[0] < self.seconds
        times.append(now)
        return over


class RunningApps:
    """hypercorn's task group for one connection, counting the ASGI apps still running on it:
    a stream the client reset holds its app, and the app its upstream request, until the app
    has seen the disconnect and returned."""

    def __init__(self, task_group: Any) -> None:
        self.task_group = task_group
        self.running = 0

    async def spawn_app(self, app: Any, *args: Any) -> Callable[[Any], Awaitable[None]]:
        self.running += 1
        put: Callable[[Any], Awaitable[None]] = await self.task_group.spawn_app(
            partial(self._run, app), *args
        )
        return put

    def spawn(self, func: Callable[..., Any], *args: Any) -> None:
        self.task_group.spawn(func, *args)

    async def _run(self, app: Any, *args: Any) -> None:
        try:
            await app(*args)
        finally:
            self.running -= 1


class Floods:
    """One HTTP/2 connection's flood counters. `sort` takes a batch of h2 events and says which
    to handle, which new streams to refuse (`running` apps at the `cap` already), and why
    the connection must end ("" when it need not): at the event that crossed a limit, where
    the events it keeps stop."""

    def __init__(self) -> None:
        self.resets = Window(RAPID_RESET_LIMIT, FLOOD_WINDOW)
        self.control = Window(CONTROL_FRAME_LIMIT, FLOOD_WINDOW)

    def sort(
        self, events: list[h2e.Event], running: int, cap: int, now: float
    ) -> tuple[list[h2e.Event], list[int], str]:
        kept: list[h2e.Event] = []
        refused: list[int] = []
        opened: set[int] = set()  # a HEADERS frame's own priority is not a PRIORITY frame
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            counted: Window | None = None
            if isinstance(event, h2e.RequestReceived):
                opened.add(event.stream_id)
            if isinstance(event, h2e.RequestReceived) and running >= cap:
                refused.append(event.stream_id)
                counted = self.resets
            elif stream_id in refused:
                continue  # the rest of a refused stream
            else:
                kept.append(event)
                running += isinstance(event, h2e.RequestReceived)
                if isinstance(event, h2e.StreamReset) and event.remote_reset:
                    counted = self.resets
                elif isinstance(event, CONTROL_FRAMES) and stream_id not in opened:
                    counted = self.control
            if counted is not None and counted.over(now):
                what = (
                    f"{RAPID_RESET_LIMIT} streams reset or refused"
                    if counted is self.resets
                    else f"{CONTROL_FRAME_LIMIT} PING, SETTINGS or PRIORITY frames"
                )
                return kept, refused, f"more than {what} within {FLOOD_WINDOW:g} s"
        return kept, refused, ""


def guard_h2_floods() -> bool:
    """Bound rapid resets and control-frame floods on each HTTP/2 connection (idempotent);
    False when the gate says no (logged). See the module docstring."""
    from hypercorn.events import Closed
    from hypercorn.protocol.h2 import H2Protocol
    from priority.priority import TooManyStreamsError

    if getattr(H2Protocol, "sidestream_guarded", False):
        return True
    if not gate_open("HTTP/2 connections get no bound on rapid resets or PING/SETTINGS floods"):
        return False
    init, handle_events = H2Protocol.__init__, H2Protocol._handle_events

    def init_counting(self: H2Protocol, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.task_group = RunningApps(self.task_group)  # type: ignore[assignment]
        self.sidestream_floods = Floods()  # type: ignore[attr-defined]

    async def calm_down(self: H2Protocol, why: str) -> None:
        peer = ":".join(map(str, self.client)) if self.client else "?"
        logger.warning("HTTP/2 client %s: %s; GOAWAY (ENHANCE_YOUR_CALM)", peer, why)
        self.connection.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_GRACE):  # a peer that reads nothing
                await self._flush()
        await self.handle(Closed())  # each stream's app is told the client left
        for buffer in list(self.stream_buffers.values()):
            await buffer.close()  # an app still writing is not left waiting for a sender
        await self.send(Closed())  # the socket closes (aborted after CLOSE_GRACE)

    async def handle_guarded(self: H2Protocol, events: list[h2e.Event]) -> None:
        if self.closed:  # calmed down: the rest of what was read is dropped
            return
        floods: Floods = self.sidestream_floods  # type: ignore[attr-defined]
        apps: RunningApps = self.task_group  # type: ignore[assignment]
        cap = self.config.h2_max_concurrent_streams
        kept, refused, why = floods.sort(events, apps.running, cap, time.monotonic())
        for stream_id in refused:
            with contextlib.suppress(StreamClosedError):  # the client's own reset came first
                self.connection.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
        try:
            await handle_events(self, kept)
        except TooManyStreamsError:  # PRIORITY frames naming 1,000 streams that never open
            why = "more streams than hypercorn's priority tree holds"
        if why:
            await calm_down(self, why)

    H2Protocol.__init__ = init_counting  # type: ignore[method-assign]
    H2Protocol._handle_events = handle_guarded  # type: ignore[method-assign]
    H2Protocol.sidestream_guarded = True  # type: ignore[attr-defined]
    return True


def close_in_time() -> bool:
    """Abort a hypercorn connection that has not closed `CLOSE_GRACE` seconds after hypercorn
    began to close it (idempotent); False when the gate says no (logged)."""
    from hypercorn.asyncio.tcp_server import TCPServer

    if getattr(TCPServer, "sidestream_close_in_time", False):
        return True
    if not gate_open(
        "a connection whose peer reads nothing may stay open after hypercorn closes it"
    ):
        return False
    close, initiate_close = TCPServer._close, TCPServer._initiate_server_close

    def abort_later(self: TCPServer) -> asyncio.TimerHandle:
        transport = self.writer.transport
        return asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    async def close_bounded(self: TCPServer) -> None:
        timer = abort_later(self)
        try:
            await close(self)
        finally:
            timer.cancel()

    async def initiate_close_bounded(self: TCPServer) -> None:
        abort_later(self)  # hypercorn does not wait for this close: the timer runs out
        await initiate_close(self)

    TCPServer._close = close_bounded  # type: ignore[method-assign]
    TCPServer._initiate_server_close = initiate_close_bounded  # type: ignore[method-assign]
    TCPServer.sidestream_close_in_time = True  # type: ignore[attr-defined]
    return True
