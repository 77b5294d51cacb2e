"""Raw HTTP/2 peers on the `h2` state machine, for what httpx and hypercorn do not show.

`H2Client` speaks h2c with prior knowledge and exposes every frame's effect: when each DATA
frame arrived and on which stream, resets in both directions, and per-stream flow control
(a `held` stream gets no WINDOW_UPDATE: a slow reader). `RecordingUpstream` is an h2c server
that records every `RST_STREAM` it receives with its error code, and answers by path:
`/hold` (headers and one SSE event, then nothing), `/silent` (nothing at all),
`/firehose/<name>/<bytes>` (SSE as fast as the peer's flow-control window allows, counting
what it sent in `sent[name]`), anything else (a small 200 body).

`frame`, `client_preface`, `request_block` and `parse_frames` write and read raw frames, for
peers that break the rules h2 would hold them to (the flood tests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events


@dataclass
class ClientStream:
    stream_id: int
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    arrivals: list[tuple[float, bytes]] = field(default_factory=list)
    first_data: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reset_code: int | None = None
    held_bytes: int = 0  # received but not yet acknowledged (held streams)

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.arrivals)

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class H2Client:
    """One h2c connection (prior knowledge); `request()` opens a stream and returns it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.streams: dict[int, ClientStream] = {}
        self.data_order: list[int] = []  # the stream of each DATA frame, in arrival order
        self.held: set[int] = set()
        self.closed = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[H2Client]:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.conn.initiate_connection()
        self._flush()
        self._reader_task = asyncio.create_task(self._read(reader))
        try:
            yield self
        finally:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
            self._writer.close()

    def request(
        self,
        path: str,
        method: str = "GET",
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        *,
        hold: bool = False,
    ) -> ClientStream:
        stream_id = self.conn.get_next_available_stream_id()
        stream = self.streams[stream_id] = ClientStream(stream_id)
        if hold:
            self.held.add(stream_id)
        pseudo = [
            (b":method", method.encode()),
            (b":scheme", b"http"),
            (b":authority", f"127.0.0.1:{self.port}".encode()),
            (b":path", path.encode()),
        ]
        extra = [(k.lower().encode(), v.encode()) for k, v in headers]
        self.conn.send_headers(stream_id, pseudo + extra, end_stream=body is None)
        if body is not None:
            self.conn.send_data(stream_id, body, end_stream=True)
        self._flush()
        return stream

    def reset(self, stream: ClientStream) -> float:
        """Send RST_STREAM(CANCEL) for `stream`; returns the loop time it was written."""
        self.conn.reset_stream(stream.stream_id, h2.errors.ErrorCodes.CANCEL)
        self._flush()
        return self._loop.time()

    def release(self, stream: ClientStream) -> None:
        """Stop holding `stream`: open its window by everything it received so far."""
        self.held.discard(stream.stream_id)
        if stream.held_bytes:
            self.conn.increment_flow_control_window(stream.held_bytes, stream.stream_id)
            stream.held_bytes = 0
            self._flush()

    def _flush(self) -> None:
        assert self._writer is not None
        data = self.conn.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(65536):
                for event in self.conn.receive_data(data):
                    self._on(event)
                self._flush()
        finally:
            self.closed.set()

    def _on(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if stream is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            stream.headers = [(k, v) for k, v in event.headers if not k.startswith(b":")]
            stream.status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            size = event.flow_controlled_length
            if event.data:
                stream.arrivals.append((self._loop.time(), event.data))
                self.data_order.append(stream.stream_id)
                stream.first_data.set()
            if stream.stream_id in self.held:
                self.conn.increment_flow_control_window(size)  # the connection's, only
                stream.held_bytes += size
            elif size:
                self.conn.acknowledge_received_data(size, stream.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            stream.ended.set()
        elif isinstance(event, h2.events.StreamReset):
            stream.reset_code = event.error_code
            stream.ended.set()


@dataclass
class Reset:
    at: float
    stream_id: int
    error_code: int
    probe: str | None


class RecordingUpstream:
    """An h2c server recording requests and the RST_STREAM frames it receives."""

    UNIT = b"data: " + b"x" * 1016 + b"\n\n"  # 1 KiB

    def __init__(self) -> None:
        self.connections = 0
        self.sent: dict[str, int] = {}
        self.requests: dict[int, str | None] = {}  # stream id -> x-probe header
        self.resets: list[Reset] = []
        self.changed = asyncio.Event()
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RecordingUpstream]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_for(self, predicate: object, timeout: float = 5.0) -> None:
        assert callable(predicate)
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        loop = asyncio.get_running_loop()
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        window = asyncio.Event()
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self._answer(conn, event, writer, window)
                    elif isinstance(
                        event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)
                    ):
                        window.set()
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamReset):
                        probe = self.requests.get(event.stream_id)
                        self.resets.append(
                            Reset(loop.time(), event.stream_id, event.error_code, probe)
                        )
                        self.changed.set()
                        window.set()
                writer.write(conn.data_to_send())
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(
        self,
        conn: h2.connection.H2Connection,
        event: h2.events.RequestReceived,
        writer: asyncio.StreamWriter,
        window: asyncio.Event,
    ) -> None:
        headers = dict(event.headers)
        self.requests[event.stream_id] = (headers.get(b"x-probe") or b"").decode() or None
        self.changed.set()
        path = headers[b":path"]
        if path == b"/silent":
            return
        sse = [(b":status", b"200"), (b"content-type", b"text/event-stream")]
        if path == b"/hold":
            conn.send_headers(event.stream_id, sse)
            conn.send_data(event.stream_id, b"data: 0\n\n")
            return
        if path.startswith(b"/firehose/"):
            _, _, name, size = path.decode().split("/")
            conn.send_headers(event.stream_id, sse)
            task = asyncio.create_task(
                self._firehose(conn, writer, window, event.stream_id, name, int(size))
            )
            self._tasks.add(task)
            return
        conn.send_headers(event.stream_id, [(b":status", b"200"), (b"content-length", b"2")])
        conn.send_data(event.stream_id, b"ok", end_stream=True)

    async def _firehose(
        self,
        conn: h2.connection.H2Connection,
        writer: asyncio.StreamWriter,
        window: asyncio.Event,
        stream_id: int,
        name: str,
        size: int,
    ) -> None:
        unit = self.UNIT
        self.sent[name] = 0
        while self.sent[name] < size:
            stream = conn.streams.get(stream_id)
            if stream is None or stream.closed:
                return
            room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            units = min(room // len(unit), (size - self.sent[name]) // len(unit))
            if units == 0:
                window.clear()
                await window.wait()
                continue
            conn.send_data(stream_id, unit * units)
            self.sent[name] += units * len(unit)
            writer.write(conn.data_to_send())
            await writer.drain()
        conn.end_stream(stream_id)
        writer.write(conn.data_to_send())


# --- raw frames, for peers that break the rules h2 would hold them to ----------------------

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 2, 3, 4, 6, 7, 8
CONTINUATION = 9
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame, as is: no state checks."""
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


def client_preface() -> bytes:
    """The h2c prior-knowledge preface and the client's SETTINGS."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return conn.data_to_send()


def request_block(path: str, authority: str = "127.0.0.1") -> bytes:
    """A GET request's header block that needs no HPACK state (static names, no indexing),
    so it can be sent any number of times, on any stream."""
    return (
        b"\x82\x86"  # :method GET, :scheme http
        + b"\x04" + bytes([len(path)]) + path.encode()  # :path, literal, not indexed
        + b"\x01" + bytes([len(authority)]) + authority.encode()  # :authority
    )  # fmt: skip


@dataclass
class RawFrame:
    kind: int
    flags: int
    stream: int
    payload: bytes


def parse_frames(data: bytes) -> list[RawFrame]:
    """The whole frames in `data`, in order (a cut-off last one is left out)."""
    frames, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        if at + 9 + length > len(data):
            break
        stream = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
        frames.append(RawFrame(data[at + 3], data[at + 4], stream, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return frames


def goaway_codes(data: bytes) -> list[int]:
    """The error code of each GOAWAY frame in `data`."""
    return [int.from_bytes(f.payload[4:8], "big") for f in parse_frames(data) if f.kind == GOAWAY]
