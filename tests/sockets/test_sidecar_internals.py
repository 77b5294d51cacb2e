"""The gates in front of each dependency's private internals (`sidecar.servers.uvicorn_internals`,
`sidecar.servers.uvloop_internals`, `sidecar.servers.hypercorn_internals`,
`sidecar.upstream.httpcore_internals`).

Each gate is checked both ways: the installed release is one the internals were checked
against (so an upgrade that moves them shows up here, not in production), and when the gate
says no the sidecar still serves a stream correctly on the dependency's public path.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import threading
import tomllib
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
import uvicorn
import uvloop

from middleware import speedups
from middleware.registry import StreamRegistry
from middleware.types import SEND_NOWAIT, Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.servers import hypercorn_internals, uvicorn_internals, uvloop_internals
from sidecar.servers.hypercorn_listener import HypercornListener
from sidecar.servers.uvicorn_listener import traffic_protocol, traffic_server, use_internals
from sidecar.upstream import httpcore_internals
from sidecar.upstream.pools import make_pool
from sidecar.upstream.types import Upstream
from tests.support.clients import connection, read_response, request
from tests.support.compiled import built
from tests.support.servers import bound_socket, serve, wait_listening
from tests.support.sseparse import parse

STREAM = "/v1/stream?ttft_ms=0&itl_ms=1&tokens={tokens}"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def complete(body: bytes, tokens: int) -> bool:
    """`body` is a whole emulator stream of `tokens` content events, then [DONE]."""
    events = [event[1] for event in parse(body)]
    return events[-1] == "[DONE]" and len(events) >= tokens + 1


@contextlib.asynccontextmanager
async def traffic_listener(app: Any, settings: Any, internals: bool) -> AsyncIterator[int]:
    """The sidecar's traffic server (`traffic_server`) serving `app`; yields its port."""
    server = traffic_server(app, settings, internals=internals)
    sock = bound_socket()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_listening(sock.getsockname()[1])
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


# --- uvicorn -------------------------------------------------------------------------------


def test_the_installed_uvicorn_is_a_checked_release() -> None:
    """The gate says yes for the uvicorn installed here and no for releases nobody checked:
    an upgrade that was not checked makes this fail before it silently loses the fast path."""
    assert uvicorn_internals.checked(), uvicorn.__version__
    assert uvicorn_internals.checked(uvicorn_internals.CHECKED[0] + ".0")
    assert not uvicorn_internals.checked("0.30.0")
    assert not uvicorn_internals.checked("99.0.0")


@pytest.mark.parametrize("hook", ["capture_signals", "main_loop", "on_tick", "shutdown"])
def test_the_uvicorn_gate_says_no_when_a_server_method_is_gone(
    hook: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checked version whose `Server` lost a method the contract module replaces, or
    relies on to shut its connections down, is refused too."""
    assert uvicorn_internals.checked()
    monkeypatch.delattr(uvicorn.Server, hook)
    assert not uvicorn_internals.checked()


@pytest.mark.parametrize("field", ["connections", "tasks", "default_headers", "total_requests"])
def test_the_uvicorn_gate_says_no_when_a_server_state_field_is_gone(
    field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checked version whose `ServerState` no longer has a field the sidecar's protocol
    reads or writes (its open connections, its request tasks, the default headers, the
    request count) is refused too."""
    from uvicorn.server import ServerState

    made = ServerState.__init__

    def without(self: ServerState) -> None:
        made(self)
        delattr(self, field)

    assert uvicorn_internals.checked()
    monkeypatch.setattr(ServerState, "__init__", without)
    assert not uvicorn_internals.checked()


def test_the_sidecars_protocol_is_its_own_not_a_subclass_of_uvicorns() -> None:
    """uvicorn is reached through its public door: the traffic protocol is an
    `asyncio.Protocol` of sidestream's, and its request cycle a class of its own, neither
    derived from a class of uvicorn's."""
    from sidecar.servers.http1 import RequestCycle

    protocol = traffic_protocol(load(["--upstream", "http://127.0.0.1:1"], environ={}))
    assert issubclass(protocol, asyncio.Protocol)
    for cls in (protocol, RequestCycle):
        assert not [base for base in cls.__mro__ if base.__module__.startswith("uvicorn")]


@pytest.mark.parametrize("gate", [True, False], ids=["checked", "not-checked"])
async def test_the_traffic_listener_streams_on_either_side_of_the_uvicorn_gate(
    gate: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The traffic server the sidecar builds, with the gate saying yes (the sidecar's
    protocol, `send_nowait` offered) and no (uvicorn's plain httptools protocol, no
    extension, one warning line): the stream arrives whole either way."""
    if not gate:
        monkeypatch.setattr(uvicorn, "__version__", "99.0.0")
    with caplog.at_level(logging.WARNING, logger="sidestream"):
        internals = use_internals()
    assert internals is gate
    warnings = [r for r in caplog.records if r.name == "sidestream" and "uvicorn" in r.message]
    assert len(warnings) == (0 if gate else 1)

    offered: list[bool] = []
    async with serve(make_app(stats=Stats())) as upstream:
        settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
        guard = build_guard(settings, StreamRegistry())

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                offered.append(SEND_NOWAIT in scope.get("extensions", {}))
            await guard(scope, receive, send)

        async with traffic_listener(app, settings, internals) as port:
            response = await request(port, "GET", STREAM.format(tokens=20))
            body = await asyncio.wait_for(response.body(), 10)
            response.close()
    assert response.status == 200 and complete(body, 20)
    assert offered == [gate]


async def _heap_per_connection(server: str, n: int = 100) -> float:
    """Heap bytes per connection (whole process) with one request each in flight, its app
    waiting on something other than `receive`: what an idle stream's server side holds."""
    hold, all_in = asyncio.Event(), asyncio.Event()
    started = 0

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal started
        if scope["type"] != "http":
            return
        started += 1
        if started == n:
            all_in.set()
        await hold.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serve(app, server, proxy_headers=False) as port:  # type: ignore[arg-type]
        writers = []
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(n):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                writers.append(writer)
            await asyncio.wait_for(all_in.wait(), 10)
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            hold.set()
            for writer in writers:
                writer.close()
    return (after - before) / n


async def test_the_sidecars_protocol_holds_a_connection_in_less_memory_than_uvicorns() -> None:
    """An open connection with a request in flight (read whole) costs the sidecar's protocol
    at least a tenth less than uvicorn's own (2 KiB or more of some 14 KiB on Python 3.11 and
    3.12; 3.13 made uvicorn's own objects cheaper, and the gap 1.8 KiB): its fields in slots
    (no instance dict), what the server passes each connection shared, the pipeline a list,
    the two events' waiter queues made only when waited on, and no request parser until the
    client sends more.
    Without any one of those it costs more than uvicorn's; the test's own client is the same
    for both."""
    ours = await _heap_per_connection("sidecar")
    theirs = await _heap_per_connection("uvicorn-httptools")
    assert ours < theirs * 0.9, (ours, theirs)


async def test_servers_sharing_the_sidecars_protocol_class_each_serve_their_own_app() -> None:
    """The protocol class keeps what a server passes every connection for the first server
    that uses it: a second server given the same class still runs its own app, with its own
    root path, and each kept-alive connection keeps its server's, whichever server the
    connections before and after it came to."""
    protocol = traffic_protocol(load(["--upstream", "http://127.0.0.1:1"], environ={}))

    def answering(name: bytes) -> Any:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                return
            body = name + b" " + scope["root_path"].encode() + b" " + scope["path"].encode()
            headers = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app

    async with (
        serve(answering(b"a"), http=protocol, proxy_headers=False) as a,
        serve(answering(b"b"), http=protocol, proxy_headers=False, root_path="/b") as b,
        contextlib.AsyncExitStack() as opened,  # closes the connections however this ends
    ):
        connections = {}
        bodies = []
        for name, port in (("b", b), ("a", a), ("b", b), ("a", a)):  # each: a request on it
            if name not in connections:  # (then on a new connection to the other server)
                connections[name] = await opened.enter_async_context(connection(port))
            reader, writer = connections[name]
            writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            response = await asyncio.wait_for(read_response(reader, writer), 5)
            bodies.append(await asyncio.wait_for(response.body(), 5))
    assert bodies == [b"b /b /b/x", b"a  /x"] * 2


async def test_each_request_on_a_kept_alive_connection_is_parsed_anew() -> None:
    """The sidecar's protocol drops its request parser once a request is read whole and makes
    one when the client sends more: requests that follow on the connection, each head in
    two writes, are parsed and answered as the first was."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        message = await receive()
        body = scope["path"].encode() + b":" + message.get("body", b"")
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async with serve(app, "sidecar") as port, connection(port) as (reader, writer):
        bodies = []
        for i in range(3):
            writer.write(b"POST /%d HTTP/1.1\r\nHost: x\r\n" % i)
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"Content-Length: 2\r\n\r\nb%d" % i)
            response = await asyncio.wait_for(read_response(reader, writer), 5)
            bodies.append(await response.body())
    assert bodies == [b"/0:b0", b"/1:b1", b"/2:b2"]


async def test_pipelined_requests_are_answered_in_order_by_the_sidecars_protocol() -> None:
    """Requests written back to back on one connection are each answered, in order: the
    protocol queues the later ones in its pipeline (a list) until the one before ends."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await asyncio.sleep(0.01)  # still answering the first when the others are parsed
        body = scope["path"].encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async with serve(app, "sidecar") as port, connection(port) as (reader, writer):
        writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3)))
        bodies = []
        for _ in range(3):
            response = await asyncio.wait_for(read_response(reader, writer), 5)
            bodies.append(await response.body())
    assert bodies == [b"/0", b"/1", b"/2"]


# --- uvloop --------------------------------------------------------------------------------


def test_the_installed_uvloop_is_a_checked_release() -> None:
    """The gate says yes for the uvloop installed here and no for releases nobody checked."""
    assert uvloop_internals.checked(), uvloop_internals.installed()
    assert not uvloop_internals.checked("0.22.1") and not uvloop_internals.checked("99.0.0")
    # exact releases: a patch release nobody read (its private layouts may move) is closed
    assert not uvloop_internals.checked("0.23.1") and not uvloop_internals.checked("0.23")


@contextlib.contextmanager
def uvloop_gate(open_: bool) -> Iterator[None]:
    """The uvloop gate as it is here (`open_`) or as for a release nobody checked (it is
    decided once a process: decided again on the way in and out)."""
    with pytest.MonkeyPatch.context() as patch:
        if not open_:
            patch.setattr(uvloop_internals, "installed", lambda: "99.0.0")
        uvloop_internals._gated_type.cache_clear()
        try:
            yield
        finally:
            uvloop_internals._gated_type.cache_clear()


async def _served_transport() -> tuple[asyncio.BaseTransport, int | None]:
    """A server-side transport of the running loop (one TCP connection made to it), and
    what `direct_fd` gives for it."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[asyncio.BaseTransport] = loop.create_future()

    class Catch(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.set_result(transport)

    server = await loop.create_server(Catch, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with connection(port):
        transport = await asyncio.wait_for(made, 5)
        fd = uvloop_internals.direct_fd(transport)
        transport.close()
    server.close()
    await server.wait_closed()
    return transport, fd


def test_the_socket_is_written_past_uvloops_tcp_transport_only() -> None:
    """`direct_fd` gives the socket's descriptor for uvloop's TCP transport on a checked
    release; for asyncio's own transport, or an uvloop release not checked, None (the
    transport's `write`, the public path)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        transport, fd = runner.run(_served_transport())
    assert fd is not None and fd >= 0 and type(transport).__module__ == "uvloop.loop"
    with asyncio.Runner() as runner:
        assert runner.run(_served_transport())[1] is None
    with uvloop_gate(False), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(_served_transport())[1] is None


@pytest.mark.parametrize("gate", [True, False], ids=["checked", "not-checked"])
def test_the_sidecar_streams_on_uvloop_on_either_side_of_the_uvloop_gate(
    gate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The traffic server on uvloop, as the sidecar runs it: with the gate open each chunk
    goes to the client's socket past the transport (the writer is given its descriptor),
    with it shut through the transport; a fast stream and one to a client that does not
    read for a while (the socket full, the rest held by the transport) arrive whole and in
    order either way."""
    from sidecar.servers.http1 import nowait
    from sidecar.upstream import h1

    given: list[int | None] = []
    real = nowait.direct_fd
    monkeypatch.setattr(nowait, "direct_fd", lambda t: given.append(real(t)) or given[-1])
    quieted: list[bool] = []  # what each upstream `quiet_reads` said (see the next test)

    def both(transport: Any) -> bool:  # and both callbacks are ours
        assert uvloop_internals._uvread is not None
        return bool(uvloop_internals._uvread.quieted(transport) == (True, True))

    real_quiet = h1.quiet_reads
    monkeypatch.setattr(
        h1, "quiet_reads", lambda t, lp, p: quieted.append(real_quiet(t, lp, p) and both(t))
    )

    async def main() -> tuple[bytes, bytes]:
        async with serve(make_app(stats=Stats())) as upstream:
            settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
            guard = build_guard(settings, StreamRegistry())
            async with traffic_listener(guard, settings, use_internals()) as port:
                fast = await request(port, "GET", STREAM.format(tokens=50))
                quick = await asyncio.wait_for(fast.body(), 10)
                fast.close()
                big = "/v1/stream?ttft_ms=0&itl_ms=0&tokens=20000"  # about 5 MB
                slow = await request(port, "GET", big)
                await asyncio.sleep(0.5)  # not reading: the socket fills
                late = await asyncio.wait_for(slow.body(), 20)
                slow.close()
        return quick, late

    with uvloop_gate(gate), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        quick, late = runner.run(main())
    assert complete(quick, 50) and complete(late, 20000)
    assert given and all((fd is not None) is gate for fd in given)
    # The upstream's reads are quieted at each request and again after each pause (the slow
    # client's stream pauses it), both callbacks, where the gate is open and the C part runs.
    quiet = gate and uvloop_internals._uvread is not None
    assert len(quieted) > 2 and all(said is quiet for said in quieted)


def test_quiet_reads_run_only_where_the_compiled_core_does() -> None:
    """With SIDESTREAM_NO_EXTENSIONS the reads are left as uvloop makes them (the public
    path); without it the C part is built and in use."""
    if os.environ.get(speedups.DISABLE, "") not in ("", "0"):
        assert uvloop_internals._uvread is None
    else:
        assert uvloop_internals._uvread is not None and uvloop_internals._uvread is built(
            "sidecar._uvread"
        )


class Collect(asyncio.Protocol):
    """A client protocol that keeps what it reads, and says when `size` bytes are in."""

    def __init__(self, size: int) -> None:
        self.got: list[bytes] = []
        self.size = size
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.got.append(data)
        if sum(map(len, self.got)) >= self.size and not self.done.done():
            self.done.set_result(None)


def _pattern(blocks: int) -> bytes:
    return b"".join(bytes([i % 251]) * 1000 for i in range(blocks))


@pytest.mark.parametrize("gate", [True, False], ids=["checked", "not-checked"])
def test_an_upstream_reads_buffer_callback_is_swapped_only_where_every_check_holds(
    gate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`quiet_reads` swaps uvloop's buffer callback for the GIL-free one on uvloop's TCP
    transport, reading, on its own loop, with the gate open; it says no and leaves the slot
    alone for a paused transport, another loop, asyncio's transport or a closed gate. uvloop
    puts its own back when reading starts again, and a second swap is allowed. 3 MB read in
    many reads across that, with another thread running Python meanwhile, arrive whole."""
    uvread = built("sidecar._uvread")
    if uvread is None:
        pytest.fail("sidecar._uvread is not built")  # the C part must build wherever tests run
    monkeypatch.setattr(uvloop_internals, "_uvread", uvread)
    quiet = uvloop_internals.quiet_reads
    blocks = 3000

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()

        async def serve_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            data = _pattern(blocks)
            for at in range(0, len(data), 10_000):
                writer.write(data[at : at + 10_000])
                await writer.drain()
            await reader.read()  # until the client closes
            writer.close()

        server = await asyncio.start_server(serve_bytes, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, protocol = await loop.create_connection(
            lambda: Collect(blocks * 1000), "127.0.0.1", port
        )
        seen = [quiet(transport, loop, protocol), uvread.quieted(transport)[0]]
        seen += [quiet(transport, loop, protocol)]
        other = uvloop.new_event_loop()
        transport.pause_reading()
        seen += [quiet(transport, loop, protocol)]  # not reading: no slot to swap
        transport.resume_reading()
        seen += [uvread.quieted(transport)[0], quiet(transport, other, protocol)]
        seen += [uvread.quieted(transport)[0]]
        seen += [quiet(transport, loop, protocol), uvread.quieted(transport)[0]]
        # A protocol whose `data_received` is Python's keeps uvloop's read callback.
        seen += [uvread.quieted(transport)[1]]
        other.close()
        stop = False

        def busy() -> None:  # Python on another thread while the loop reads without the GIL
            while not stop:
                sum(range(1000))

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            for _ in range(5):  # pause and resume along the way, swapping again each time
                await asyncio.sleep(0.01)
                transport.pause_reading()
                await asyncio.sleep(0.01)
                transport.resume_reading()
                quiet(transport, loop, protocol)
            await asyncio.wait_for(protocol.done, 20)
        finally:
            stop = True
            thread.join()
        transport.close()
        server.close()
        await server.wait_closed()
        assert b"".join(protocol.got) == _pattern(blocks)
        assert len(protocol.got) > 5
        return seen

    with uvloop_gate(gate), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen = runner.run(main())
    if gate:
        # swapped, and so it stays; paused: no; resumed: uvloop's again; another loop: no
        assert seen == [True, True, True, False, False, False, False, True, True, False]
    else:
        assert seen == [False] * 10
    with asyncio.Runner() as runner:  # asyncio's own loop and transport: never

        async def plain() -> bool:
            loop = asyncio.get_running_loop()
            accepted: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
            server = await asyncio.start_server(lambda r, w: accepted.set_result(w), "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            transport, protocol = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
            said = quiet(transport, loop, protocol)
            transport.close()
            (await asyncio.wait_for(accepted, 5)).close()
            server.close()
            await server.wait_closed()
            return said

        assert runner.run(plain()) is False


def _core_protocol(core: Any) -> Any:
    """A protocol on the compiled `H1Core`, as `H1Connection` is: each read of whole chunks
    goes to its sink; a read with no parser calls `abort`, which raises here."""

    class Chunks(core.H1Core, asyncio.Protocol):  # type: ignore[misc, name-defined]
        __slots__ = ("got", "half", "lost")

        def __init__(self) -> None:
            self.got: list[bytes] = []
            self.half = asyncio.Event()  # 100 chunks in
            self.chunks, self.complete, self.received = [], False, False
            self.at_boundary = self.chunk_end = True
            self._parser = object()  # never fed: every read is whole chunks
            self.sink = self.take
            self.lost = asyncio.get_running_loop().create_future()

        def take(self, body: bytes) -> bool:
            self.got.append(body)
            if len(self.got) == 100:
                self.half.set()
            return True

        def abort(self) -> None:
            raise RuntimeError("boom")  # what `data_received` raises when given no parser

        def _after_feed(self) -> None:
            pass

        def connection_lost(self, exc: Exception | None) -> None:
            self.lost.set_result(exc)

    return Chunks()


@pytest.mark.parametrize("gate", [True, False], ids=["checked", "not-checked"])
def test_a_quiet_read_callback_hands_each_read_to_data_received_and_leaves_the_rest(
    gate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the read callback swapped too (a protocol whose `data_received` is `H1Core`'s),
    200 chunks written one by one arrive whole and in order, across a pause (after which
    uvloop's callbacks are back until swapped again); the upstream's close ends the
    connection as uvloop ends it (`connection_lost(None)`). When `data_received` raises, the
    exception goes to the loop's handler and `connection_lost` gets an error, as through
    uvloop's own callback (which passes the exception itself; the swapped one, a
    ConnectionAbortedError): never None, which would read as a clean end."""
    uvread = built("sidecar._uvread")
    if uvread is None:
        pytest.fail("sidecar._uvread is not built")
    core = built("sidecar._core")
    monkeypatch.setattr(uvloop_internals, "_uvread", uvread)

    async def main() -> tuple[list[Any], Any, Any, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        handled: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: handled.append(context))
        chunks = [b"%d:%s" % (i, b"x" * (i % 50)) for i in range(200)]
        go = asyncio.Event()

        async def serve_chunks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def send(part: list[bytes]) -> None:
                for chunk in part:
                    writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    await writer.drain()
                    await asyncio.sleep(0.001)  # a read each

            await send(chunks[:100])
            await go.wait()  # the first half read, the reading paused and resumed
            await send(chunks[100:])
            writer.close()

        server = await asyncio.start_server(serve_chunks, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, protocol = await loop.create_connection(
            lambda: _core_protocol(core), "127.0.0.1", port
        )
        seen = [uvloop_internals.quiet_reads(transport, loop, protocol), uvread.quieted(transport)]
        await asyncio.wait_for(protocol.half.wait(), 10)
        transport.pause_reading()
        transport.resume_reading()
        seen += [uvread.quieted(transport)]
        uvloop_internals.quiet_reads(transport, loop, protocol)
        seen += [uvread.quieted(transport)]
        go.set()
        ended = await asyncio.wait_for(protocol.lost, 10)
        server.close()
        await server.wait_closed()

        # A read that makes `data_received` raise
        async def one_byte(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"x")
            await reader.read()
            writer.close()

        server = await asyncio.start_server(one_byte, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, failing = await loop.create_connection(
            lambda: _core_protocol(core), "127.0.0.1", port
        )
        failing._parser = None
        uvloop_internals.quiet_reads(transport, loop, failing)
        failed = await asyncio.wait_for(failing.lost, 10)
        server.close()
        await server.wait_closed()
        assert protocol.got == chunks
        return seen, ended, failed, handled

    with uvloop_gate(gate), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen, ended, failed, handled = runner.run(main())
    if gate:
        assert seen == [True, (True, True), (False, False), (True, True)]
    else:
        assert seen == [False, (False, False), (False, False), (False, False)]
    assert ended is None
    # Which callback ran: the swapped one closes with a read error, uvloop's with the exception.
    assert isinstance(failed, ConnectionAbortedError if gate else RuntimeError)
    assert [str(c.get("exception")) for c in handled] == ["boom"]


# --- hypercorn -----------------------------------------------------------------------------


def test_the_installed_hypercorn_is_a_checked_release() -> None:
    """The gate says yes for the hypercorn installed here and no for releases nobody checked."""
    assert hypercorn_internals.checked(), hypercorn_internals.installed()
    assert not hypercorn_internals.checked("0.16.0")
    assert not hypercorn_internals.checked("99.0.0")


@contextlib.asynccontextmanager
async def http2_listener(upstream: int) -> AsyncIterator[int]:
    """The `--http2` traffic listener in front of the emulator; yields its port."""
    settings = load(["--http2", "--upstream", f"http://127.0.0.1:{upstream}"], environ={})
    listener = HypercornListener(build_guard(settings, StreamRegistry()), settings, bound_socket())
    task = asyncio.create_task(listener.serve())
    try:
        for _ in range(1000):  # the port is known once it serves
            if listener.started or task.done():
                break
            await asyncio.sleep(0.005)
        await wait_listening(listener.port)
        yield listener.port
    finally:
        listener.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("gate", [True, False], ids=["checked", "not-checked"])
async def test_http2_streams_on_either_side_of_the_hypercorn_gate(
    gate: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting the `--http2` listener patches hypercorn's stream buffer only when the gate
    says yes; when it says no, hypercorn's own buffer stays (one warning line) and HTTP/2
    streams still arrive whole."""
    from hypercorn.protocol import h2 as hyper_h2

    original: Any = hyper_h2.StreamBuffer
    while getattr(original, "sidestream_bounded", False):  # patched by an earlier test
        original = original.__mro__[1]
    monkeypatch.setattr(hyper_h2, "StreamBuffer", original)  # restored after the test
    if not gate:
        monkeypatch.setattr(hypercorn_internals, "installed", lambda: "99.0.0")
    with caplog.at_level(logging.WARNING, logger="sidestream"):
        async with (
            serve(make_app(stats=Stats())) as upstream,
            http2_listener(upstream) as port,
            httpx.AsyncClient(http1=False, http2=True, timeout=10) as client,
        ):
            url = f"http://127.0.0.1:{port}" + STREAM.format(tokens=20)
            responses = await asyncio.gather(*(client.get(url) for _ in range(4)))
    for response in responses:
        assert response.http_version == "HTTP/2" and response.status_code == 200
        assert complete(response.content, 20)
    patched = getattr(hyper_h2.StreamBuffer, "sidestream_bounded", False)
    assert patched is gate
    warnings = [r for r in caplog.records if r.name == "sidestream" and "hypercorn" in r.message]
    assert len(warnings) == (0 if gate else 1)


# --- httpcore (bounded in pyproject, no runtime fallback) -----------------------------------


def test_httpcore_is_bounded_to_the_checked_series() -> None:
    """httpcore's internals are gated by an upper bound in pyproject, not at run time: the
    bound must be there, and the installed httpcore inside it and in the checked series."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (spec,) = [d for d in dependencies if d.startswith("httpcore")]
    upper = re.search(r"<\s*([\d.]+)", spec)
    assert upper is not None, f"{spec!r} has no upper bound"

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:3])

    assert version(httpcore.__version__) < version(upper.group(1))
    checked = version(httpcore_internals.CHECKED)
    assert version(httpcore.__version__)[:2] == checked[:2]


async def test_httpcore_has_every_private_name_the_h2_client_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`missing_internals` finds every name the h2 client relies on in the installed
    httpcore, on a live connection too, and reports one that a release removed."""
    async with serve(make_app(stats=Stats()), "hypercorn") as upstream:
        pool = make_pool(Upstream.parse(f"h2c://127.0.0.1:{upstream}"))
        try:
            async with pool.exchange(
                b"GET", STREAM.format(tokens=2).encode(), [(b"host", b"127.0.0.1")]
            ) as response:
                body = b"".join([chunk async for chunk in response.body])
            connection = pool.connections[0]  # type: ignore[attr-defined]
            assert httpcore_internals.missing_internals(connection) == []
        finally:
            await pool.aclose()
    assert complete(body, 2)
    monkeypatch.delattr(httpcore.AsyncHTTP2Connection, "_response_closed")
    assert httpcore_internals.missing_internals() == ["_response_closed"]
