"""The sidecar's HTTP/1.1 protocol (`sidecar.servers.http1`, behind the gate) answers
what an app sends and what a client sends as uvicorn's own httptools protocol does.

Most tests here are differential: one app, one byte string from a raw client, served once by
the sidecar's protocol and once by uvicorn's (`http="httptools"`, the same options); the bytes
each writes back, up to its close, and what the app saw must be the same. A test's last
request says `Connection: close`, so each server ends the exchange itself.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from middleware.types import Message, Receive, Scope, Send
from sidecar.config import load
from sidecar.servers.http1 import Http1Protocol
from sidecar.servers.uvicorn_listener import traffic_protocol
from tests.support.clients import connection
from tests.support.servers import serve

App = Callable[[Scope, Receive, Send], Awaitable[None]]
SERVERS = ("sidecar", "uvicorn-httptools")
OPTIONS = {"server_header": False, "date_header": False, "proxy_headers": False}


def get(path: str = "/", *, close: bool = False, extra: bytes = b"") -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"GET %s HTTP/1.1\r\nHost: x\r\n%s%s\r\n" % (path.encode(), connection, extra)


async def wire(server: str, app: App, *writes: bytes, pause: float = 0.0) -> bytes:
    """Everything `server` writes back to a client that sends `writes` (with `pause`
    seconds between them), until the server closes the connection."""
    async with (
        serve(app, server, **OPTIONS) as port,  # type: ignore[arg-type]
        connection(port) as (reader, writer),
    ):
        received = bytearray()
        for data in writes:
            writer.write(data)
            await asyncio.sleep(pause)
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            received += chunk
    return bytes(received)


async def both(app: App, *writes: bytes, pause: float = 0.0) -> bytes:
    """The bytes written back, which must be the same from the sidecar's protocol as from
    uvicorn's."""
    ours, theirs = [await wire(server, app, *writes, pause=pause) for server in SERVERS]
    assert ours == theirs
    return ours


def start(status: int = 200, headers: Any = ()) -> Message:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes = b"", more: bool = False) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


def length(data: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(len(data)).encode())]


@pytest.mark.parametrize(
    "header",
    [
        (b"x-a", b"one\r\nx-injected: 1"),
        (b"x-a", b"nul\x00"),
        (b"x-a", b"del\x7f"),
        (b"x a", b"1"),
        (b"x-a:", b"1"),
    ],
    ids=repr,
)
async def test_a_bad_header_from_the_app_is_refused_and_the_connection_closed(
    header: tuple[bytes, bytes],
) -> None:
    """A header name with a separator, space or control byte, or a value with a control byte
    other than tab (a CR LF that would smuggle a header in), makes `send` raise uvicorn's
    error; nothing of the response is written and the connection is closed."""
    errors: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await send(start(200, [(b"content-type", b"text/plain"), header]))
        except RuntimeError as exc:
            errors.append(str(exc))
            raise

    assert await both(app, get()) == b""
    assert len(errors) == 2 and errors[0] == errors[1]
    assert errors[0] in ("Invalid HTTP header name.", "Invalid HTTP header value.")


async def test_a_head_request_gets_the_head_and_no_body() -> None:
    """HEAD: the head the app gives (its Content-Length kept, no chunked framing added) and
    no body bytes, whatever body the app sends; the next request on the connection is
    answered whole after it."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        data = b"hello"
        if scope["path"] == "/sized":
            await send(start(200, [(b"content-type", b"text/plain"), *length(data)]))
            await send(body(data))
        else:  # no length: a GET would be chunked
            await send(start(200, [(b"content-type", b"text/event-stream")]))
            await send(body(b"data: 1\n\n", more=True))
            await send(body(b"data: 2\n\n"))

    head = b"HEAD %s HTTP/1.1\r\nHost: x\r\n\r\n"
    wired = await both(app, head % b"/sized" + head % b"/stream" + get("/stream", close=True))
    first, second, third = wired.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first == b"content-type: text/plain\r\ncontent-length: 5\r\n\r\n"
    assert second == b"content-type: text/event-stream\r\n\r\n"
    assert third.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_statuses_get_no_chunked_framing(status: int) -> None:
    """204 and 304 without a length: no `transfer-encoding`, no body, the connection kept
    for the next request."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await send(start(status))
            await send(body())

    wired = await both(app, get() + get(close=True))
    assert wired.count(b"HTTP/1.1 %d" % status) == 2
    assert b"transfer-encoding" not in wired


@pytest.mark.parametrize("pieces", [[b"abc", b"", b"de"], [b"abcde"], []], ids=repr)
async def test_a_content_length_response_is_written_as_sent(pieces: list[bytes]) -> None:
    """With the app's Content-Length the body goes out raw, in as many pieces as the app
    sends (an empty piece writes nothing), and the connection is kept alive."""
    data = b"".join(pieces)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send(start(200, length(data)))
        for piece in pieces:
            await send(body(piece, more=True))
        await send(body())

    def response(close: bytes = b"") -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(data), close, data)

    wired = await both(app, get() + get(close=True))
    assert wired == response() + response(b"connection: close\r\n")


@pytest.mark.parametrize(
    ("sent", "written", "error"),
    [
        ([b"abc", b"def"], b"abc", "Response content longer than Content-Length"),
        ([b"abcdef"], b"", "Response content longer than Content-Length"),  # the first write
        ([b"ab"], b"ab", "Response content shorter than Content-Length"),
    ],
)
async def test_a_body_that_breaks_its_content_length_is_an_error_and_a_close(
    sent: list[bytes], written: bytes, error: str
) -> None:
    """More or fewer bytes than the Content-Length said: uvicorn's error from `send`, the
    excess not written, and the connection closed (the client cannot frame what follows)."""
    errors: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send(start(200, [(b"content-length", b"5")]))
        try:
            for piece in sent[:-1]:
                await send(body(piece, more=True))
            await send(body(sent[-1]))
        except RuntimeError as exc:
            errors.append(str(exc))
            raise

    wired = await both(app, get() + get(close=True))
    assert wired == b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n" + written
    assert errors == [error, error]


async def test_a_kept_alive_connection_serves_one_request_after_another() -> None:
    """Requests sent one at a time on one connection are each answered on it (the app sees
    the same client address each time) until the client says close."""
    clients: list[object] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        clients.append(scope["client"])
        await send(start(200, [(b"content-type", b"text/plain")]))
        await send(body(scope["path"].encode(), more=True))
        await send(body())

    wired = await both(app, get("/1"), get("/2"), get("/3", close=True), pause=0.05)
    assert wired.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert wired.endswith(
        b"connection: close\r\ntransfer-encoding: chunked\r\n\r\n2\r\n/3\r\n0\r\n\r\n"
    )
    assert len(set(clients[:3])) == 1 and len(set(clients[3:])) == 1


@pytest.mark.parametrize(
    "request_",
    [
        b"GET / HTTP/1.0\r\n\r\n",  # 1.0: not kept alive unless asked
        get(extra=b"Connection: Keep-Alive, Close\r\n"),
        get(),  # kept alive by the client, closed by the app's header below
    ],
    ids=["http/1.0", "client-close", "app-close"],
)
async def test_a_connection_not_kept_alive_is_closed_after_its_response(request_: bytes) -> None:
    """HTTP/1.0, a client's `connection: close` or the app's: the response says
    `connection: close` once and the server closes after it."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"Connection", b"close")] if scope["http_version"] == "1.1" else []
        if b"close" not in dict(scope["headers"]).get(b"connection", b"").lower():
            headers = [(b"Connection", b"close")]
        await send(start(200, [*length(b"ok"), *headers]))
        await send(body(b"ok"))

    wired = await both(app, request_)  # `wire` returns only once the server closed
    assert wired.lower().count(b"connection: close\r\n") == 1
    assert wired.endswith(b"\r\n\r\nok")


async def test_pipelined_requests_with_bodies_are_answered_in_order() -> None:
    """Requests with bodies written in one go are read and answered one after another, each
    app seeing its own body."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        data = b""
        while True:
            message = await receive()
            data += message.get("body", b"")
            if not message.get("more_body"):
                break
        await asyncio.sleep(0.01)  # the next request is parsed (and queued) meanwhile
        await send(start(200, length(data)))
        await send(body(data))

    def post(data: bytes, close: bool = False) -> bytes:
        connection = b"Connection: close\r\n" if close else b""
        return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (
            len(data),
            connection,
            data,
        )

    wired = await both(app, post(b"one") + post(b"two") + post(b"three", close=True))
    responses = wired.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert [response.rpartition(b"\r\n\r\n")[2] for response in responses] == [
        b"one",
        b"two",
        b"three",
    ]


class Kept(logging.Handler):
    """The records of one logger, kept: uvicorn's loggers do not reach pytest's capture."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("server", SERVERS)
async def test_a_client_that_leaves_mid_response_is_told_to_the_app(
    server: str, method: str
) -> None:
    """The client closes during a response (a chunked one, or a HEAD one, which gets no
    `sidestream.send_nowait` listener): the app's `receive()` says `http.disconnect`, and
    its sends after that return quietly (nothing raised, nothing logged as an error), under
    either protocol."""
    seen: list[str] = []
    done = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        assert (await receive())["type"] == "http.request"
        await send(start(200, [(b"content-type", b"text/event-stream")]))
        await send(body(b"data: 1\n\n", more=True))
        seen.append((await receive())["type"])  # waits: the request has no more body
        await send(body(b"data: 2\n\n", more=True))
        await send(body())
        seen.append("returned")
        done.set()

    kept = Kept()
    async with serve(app, server, **OPTIONS) as port:  # type: ignore[arg-type]
        logging.getLogger("uvicorn.error").addHandler(kept)
        try:
            async with connection(port) as (reader, writer):
                writer.write(b"%s / HTTP/1.1\r\nHost: x\r\n\r\n" % method.encode())
                end = b"data: 1\n\n\r\n" if method == "GET" else b"\r\n\r\n"
                head = await asyncio.wait_for(reader.readuntil(end), 5)
                writer.close()
                await asyncio.wait_for(done.wait(), 5)
        finally:
            logging.getLogger("uvicorn.error").removeHandler(kept)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert seen == ["http.disconnect", "returned"]
    assert [r for r in kept.records if r.levelno >= logging.ERROR] == []


async def test_the_app_sees_the_request_headers_uvicorn_gives_it() -> None:
    """Request headers in the scope: names lower-cased, values without trailing blanks (their
    inner and non-ASCII bytes kept), in order, repeats kept; the same when the head arrives
    in pieces that split a header."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        data = repr(scope["headers"]).encode()
        await send(start(200, length(data)))
        await send(body(data))

    head = (
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Trailing: a b \t \r\nX-REPEAT: 1\r\nx-repeat: 2\r\n"
        b"X-Empty:\r\nX-High: caf\xc3\xa9\r\nUser-Agent: OpenAI/Python 1.0\r\n"
        b"Connection: close\r\n\r\n"
    )
    wired = await both(app, head)
    assert wired.endswith(
        repr(
            [
                (b"host", b"x"),
                (b"x-trailing", b"a b"),
                (b"x-repeat", b"1"),
                (b"x-repeat", b"2"),
                (b"x-empty", b""),
                (b"x-high", b"caf\xc3\xa9"),
                (b"user-agent", b"OpenAI/Python 1.0"),
                (b"connection", b"close"),
            ]
        ).encode()
    )
    assert await both(app, head[:30], head[30:50], head[50:], pause=0.02) == wired


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    """`Expect: 100-continue` (in any case): the interim `100 Continue` goes out when the app
    first asks for the body, not before; an app that answers without reading sends none."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        data = b""
        if scope["path"] == "/read":
            data = (await receive())["body"]
        await send(start(200, length(data)))
        await send(body(data))

    def expecting(path: bytes, close: bool) -> bytes:
        connection = b"Connection: close\r\n" if close else b""
        return (
            b"POST %s HTTP/1.1\r\nHost: x\r\nEXPECT: 100-Continue \r\nContent-Length: 3\r\n%s\r\n"
            % (
                path,
                connection,
            )
        )

    wired = await both(app, expecting(b"/read", False), b"abc", pause=0.1)
    assert wired.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert wired.endswith(b"\r\n\r\nabc")
    wired = await both(app, expecting(b"/skip", True), pause=0.1)
    assert b"100 Continue" not in wired


async def test_an_app_that_fails_before_its_response_gets_uvicorns_500() -> None:
    """An app that raises before it starts a response: uvicorn's 500, with `connection:
    close`, then the close."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raise ValueError("boom")

    wired = await both(app, get())
    assert wired.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert wired.endswith(b"connection: close\r\n\r\nInternal Server Error")


@pytest.mark.parametrize("ending", ["raise", "return", "return a value", "a chunk, then raise"])
async def test_an_app_that_stops_after_its_head_leaves_the_head_then_a_close(ending: str) -> None:
    """An app that raises or returns after it sent its response head, the response not
    complete: the head (and anything written after it), then the close, as under uvicorn's
    protocol, which wrote the head when it was sent (the sidecar's holds it for the first
    body write, and writes it before the close)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> Any:
        if scope["type"] != "http":
            return None
        await send(start(200, [(b"content-type", b"text/plain")]))
        if ending == "a chunk, then raise":
            await send(body(b"abc", more=True))
        if ending == "return":
            return None
        if ending == "return a value":
            return 1
        raise ValueError("boom")

    wired = await both(app, get())
    assert wired.startswith(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n")
    assert wired.endswith(b"\r\n\r\n3\r\nabc\r\n" if "chunk" in ending else b"\r\n\r\n")


class _Recording:
    """A transport's stand-in that records each `write` and passes everything on."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def test_the_head_leaves_with_the_first_body_write_or_at_its_turns_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sidecar's protocol holds a response's head for its first body write: a stream's
    head and first chunk leave in one write (one system call fewer, and that one before the
    first token). It holds it no longer than the loop turn it was sent in: an app that
    sends its head and then waits (a model still thinking) has the head written alone, and
    the client reads it while the app waits."""
    writes: list[bytes] = []
    made = Http1Protocol.connection_made

    def connection_made(self: Http1Protocol, transport: Any) -> None:
        made(self, _Recording(transport, writes))

    monkeypatch.setattr(Http1Protocol, "connection_made", connection_made)
    go = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send(start(200, [(b"content-type", b"text/event-stream")]))
        if scope["path"] == "/wait":
            await go.wait()
        await send(body(b"data: 1\n\n", more=True))
        await send(body())

    async with (
        serve(app, "sidecar", **OPTIONS) as port,  # type: ignore[arg-type]
        connection(port) as (reader, writer),
    ):
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        head += b"transfer-encoding: chunked\r\n\r\n"
        chunk = b"9\r\ndata: 1\n\n\r\n"
        writer.write(get("/now"))
        assert (
            await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5) == head + chunk + b"0\r\n\r\n"
        )
        assert writes == [head + chunk, b"0\r\n\r\n"]
        writes.clear()
        writer.write(get("/wait"))
        try:
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == head
            assert writes == [head] and not go.is_set()
        finally:
            go.set()
        end = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        assert end == chunk + b"0\r\n\r\n"


async def test_the_access_log_line_is_uvicorns() -> None:
    """With uvicorn's access log on, the line per response is the one uvicorn writes."""
    kept = Kept()
    access = logging.getLogger("uvicorn.access")
    level = access.level

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            access.addHandler(kept)  # here: each server's start sets uvicorn's logging up anew
            access.setLevel(logging.INFO)
            await send(start(201, length(b"")))
            await send(body())

    try:
        await both(app, get("/a%20b?q=1", close=True))
    finally:
        access.removeHandler(kept)
        access.setLevel(level)
    lines = [record.getMessage() for record in kept.records]
    assert len(lines) == 2
    ours, theirs = (line.split(" - ", 1)[1] for line in lines)  # their client ports differ
    assert ours == theirs == '"GET /a%20b?q=1 HTTP/1.1" 201'


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_the_scope_names_the_connections_two_addresses(host: str) -> None:
    """`server` and `client` in the scope are the connection's own two ends, (host, port),
    over IPv4 and IPv6 alike, as under uvicorn's protocol."""
    seen: list[tuple[object, object]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            seen.append((scope["server"], scope["client"]))
            await send(start(204))
            await send(body())

    for server in SERVERS:
        async with (
            serve(app, server, host, **OPTIONS) as port,  # type: ignore[arg-type]
            connection(port, host) as (reader, writer),
        ):
            writer.write(get(close=True))
            await asyncio.wait_for(reader.read(), 5)
            local = writer.get_extra_info("sockname")
        assert seen[-1] == ((host, port), (local[0], local[1])), server


class _Transport(asyncio.Transport):
    """A transport that kept its two addresses and whose socket must not be asked."""

    def __init__(self, sockname: tuple[Any, ...], peername: tuple[Any, ...]) -> None:
        super().__init__({"sockname": sockname, "peername": peername})

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            raise AssertionError("the socket was asked for an address the transport has")
        return super().get_extra_info(name, default)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("sockname", "peername"),
    [
        (("127.0.0.1", 8080), ("127.0.0.1", 50000)),
        (("::1", 8080, 0, 0), ("::1", 50000, 0, 0)),
    ],
)
def test_the_addresses_come_from_the_transport_not_the_socket(
    sockname: tuple[Any, ...], peername: tuple[Any, ...]
) -> None:
    """The protocol takes a connection's addresses from what the event loop read at accept
    (the transport's `sockname` and `peername`), as (host, port): it does not ask the
    socket again, which under uvloop costs a socket object and two system calls each."""
    config = uvicorn.Config(lambda *_: None, http="httptools", log_level="warning")
    config.load()
    protocol_class = traffic_protocol(load(["--upstream", "http://127.0.0.1:1"], environ={}))
    loop = asyncio.new_event_loop()
    try:
        protocol = protocol_class(config, ServerState(), {}, _loop=loop)
        protocol.connection_made(_Transport(sockname, peername))
        assert protocol.server == sockname[:2]
        assert protocol.client == peername[:2]
        protocol.connection_lost(None)
    finally:
        loop.close()


def test_connections_from_one_host_to_one_address_share_their_address_objects() -> None:
    """Thousands of open streams from one client host to one listening address: each
    connection's scope holds the same server address tuple and client host string as the
    connection before it (equal values, one object: an idle stream holds no copies), and a
    different address or host gets its own."""
    config = uvicorn.Config(lambda *_: None, http="httptools", log_level="warning")
    config.load()
    protocol_class = traffic_protocol(load(["--upstream", "http://127.0.0.1:1"], environ={}))
    loop = asyncio.new_event_loop()
    try:
        made = []
        for sockname, peername in [
            (("127.0.0.1", 8080), ("10.0.0.7", 50000)),
            (("127.0.0.1", 8080), ("10.0.0.7", 50001)),
            (("127.0.0.2", 8080), ("10.0.0.8", 50002)),
        ]:
            # new objects each time, as the event loop makes them per connection
            local = ("".join(["127.0.0.", sockname[0][-1]]), sockname[1])
            remote = ("".join(["10.0.0.", peername[0][-1]]), peername[1])
            protocol = protocol_class(config, ServerState(), {}, _loop=loop)
            protocol.connection_made(_Transport(local, remote))
            made.append((protocol.server, protocol.client))
            protocol.connection_lost(None)
        (s1, c1), (s2, c2), (s3, c3) = made
        assert s1 == s2 == ("127.0.0.1", 8080) and s1 is s2
        assert c1 == ("10.0.0.7", 50000) and c2 == ("10.0.0.7", 50001) and c1[0] is c2[0]
        assert s3 == ("127.0.0.2", 8080) and c3 == ("10.0.0.8", 50002)
    finally:
        loop.close()


WEBSOCKET = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def test_a_websocket_upgrade_is_handed_to_uvicorns_websocket_protocol() -> None:
    """A WebSocket handshake goes to uvicorn's WebSocket protocol, as from uvicorn's own
    HTTP protocol: the app gets a `websocket` scope (no `http` one), and a handshake it
    refuses (as the sidecar's proxy does) is answered with the same bytes."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            seen.append(f"{scope['type']} {scope['path']}")
        if scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.close", "code": 1003})

    # The WebSocket library writes a `Date` of its own: the second it was written in.
    ours, theirs = [
        re.sub(rb"\r\nDate: [^\r]*", b"", await wire(server, app, WEBSOCKET)) for server in SERVERS
    ]
    assert ours == theirs and ours.startswith(b"HTTP/1.1 403 ")
    assert seen == ["websocket /ws"] * 2


async def test_past_the_concurrency_limit_the_answer_is_uvicorns_503() -> None:
    """With uvicorn's `limit_concurrency` reached (one: the asking connection is the one),
    the request is answered 503 as uvicorn answers it, and the app is not called."""
    called: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            called.append(scope["path"])

    answers = []
    for server in SERVERS:
        async with (
            serve(app, server, limit_concurrency=1, **OPTIONS) as port,  # type: ignore[arg-type]
            connection(port) as (reader, writer),
        ):
            writer.write(get(close=True))
            answers.append(await asyncio.wait_for(reader.read(), 5))
    assert answers[0] == answers[1]
    assert answers[0].startswith(b"HTTP/1.1 503 ") and answers[0].endswith(b"Service Unavailable")
    assert called == []
