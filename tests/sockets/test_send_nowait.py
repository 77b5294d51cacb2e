"""The `sidestream.send_nowait` ASGI extension (middleware.types.SEND_NOWAIT), at each layer.

The sidecar relays an upstream read straight to the client from the upstream protocol's
callback when nothing needs waiting for; every rule the ASGI `send` path keeps must still
hold: the guard sees and counts every byte, the server's flow control still stops a relay,
and the app never gets a way around the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from middleware.cycle import Cycle
from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry
from middleware.resume import SLICE_BYTES
from middleware.types import SEND_NOWAIT, Message, Receive, Scope, Send, SendNowait
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from sidecar.upstream.h1pool import H1Pool
from tests.support.apps import SCOPE, SSE_HEADERS, chunk
from tests.support.clients import request
from tests.support.procs import chat
from tests.support.servers import serve
from tests.support.sseparse import parse
from tests.support.upstreams import RawConnection, RawUpstream

START = {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}


def body(data: bytes, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


class Server:
    """A hand-written server side: records `send` messages and nowait writes in one list."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.wire: list[bytes] = []
        self.nowait_calls = 0

    def nowait(self, data: bytes) -> bool:
        self.nowait_calls += 1
        if self.accept:
            self.wire.append(data)
        return self.accept

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.wire.append(message.get("body", b""))

    def scope(self) -> Scope:
        return {**SCOPE, "extensions": {SEND_NOWAIT: {"send": self.nowait}}}


async def drive(app: Any, server: Server, scope: Scope | None = None) -> None:
    done = asyncio.Event()

    async def receive() -> Message:
        if not done.is_set():
            done.set()
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    await app(scope if scope is not None else server.scope(), receive, server.send)


def app_nowait(scope: Scope) -> SendNowait:
    fn: SendNowait = scope["extensions"][SEND_NOWAIT]["send"]
    return fn


# --- StreamGuard ---------------------------------------------------------------------------


async def test_the_app_gets_the_guards_nowait_never_the_servers() -> None:
    """With the extension offered, the app's scope carries the guard's function (the guard's
    checks first); without it, the app's scope has no such extension at all."""
    server = Server()
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)
        await send(START)
        await send(body(b"", more=False))

    await drive(StreamGuard(app), server)
    await drive(StreamGuard(app), server, scope=dict(SCOPE))
    offered, plain = seen
    assert app_nowait(offered) is not server.nowait
    assert callable(app_nowait(offered))
    assert SEND_NOWAIT not in plain.get("extensions", {})


async def test_guard_refuses_what_only_send_can_do() -> None:
    """Refused without calling the server before headers and before the first body byte (a
    BOM may need dropping); taken once the stream is under way."""
    server = Server()
    results: list[bool] = []

    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        nowait = app_nowait(scope)
        results.append(nowait(b"data: early\n\n"))  # before headers
        await send(START)
        results.append(nowait(chunk("a")))  # before the first body byte
        await send(body(chunk("a")))
        results.append(nowait(chunk("b")))  # a stream under way: taken
        await send(body(b"", more=False))

    await drive(StreamGuard(stream), server)
    assert results == [False, False, True]
    assert server.nowait_calls == 1
    assert b"".join(server.wire) == chunk("a") + chunk("b")


@pytest.mark.parametrize(
    "headers",
    [[(b"content-type", b"application/json")], [*SSE_HEADERS, (b"content-encoding", b"gzip")]],
    ids=["not-a-stream", "compressed"],
)
async def test_guard_refuses_for_a_plain_or_compressed_response(
    headers: list[tuple[bytes, bytes]],
) -> None:
    """A response the guard does not stream, or one it must inflate, goes by `send` only."""
    server = Server()
    refused: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({**START, "headers": headers})
        await send(body(b"x"))
        refused.append(app_nowait(scope)(b"y"))
        await send(body(b"", more=False))

    await drive(StreamGuard(app), server)
    assert refused == [False]
    assert server.nowait_calls == 0


async def test_what_the_server_refuses_is_not_counted_and_goes_by_send() -> None:
    """A server refusal (flow control) returns False and the guard records nothing for that
    chunk: it is relayed once, by `send`, and the stream's text is intact."""
    server = Server(accept=False)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(START)
        await send(body(chunk("a")))
        for word in ("b", "c"):
            if not app_nowait(scope)(chunk(word)):
                await send(body(chunk(word)))
        await send(body(b"", more=False))

    await drive(StreamGuard(app), server)
    assert server.nowait_calls == 2
    assert b"".join(server.wire) == chunk("a") + chunk("b") + chunk("c")


async def test_nowait_is_refused_while_a_send_is_under_way() -> None:
    """While the app's `send` waits in the server (flow control), nowait refuses: its bytes
    would overtake the chunk still waiting to be written."""
    server = Server()
    release = asyncio.Event()
    results: list[bool] = []
    plain_send = server.send

    async def slow_send(message: Message) -> None:
        if message.get("body") == chunk("b"):
            await release.wait()
        await plain_send(message)

    server.send = slow_send  # type: ignore[method-assign]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(START)
        await send(body(chunk("a")))
        waiting = asyncio.ensure_future(send(body(chunk("b"))))
        await asyncio.sleep(0)
        results.append(app_nowait(scope)(chunk("c")))
        release.set()
        await waiting
        results.append(app_nowait(scope)(chunk("c")))
        await send(body(b"", more=False))

    await drive(StreamGuard(app), server)
    assert results == [False, True]
    assert b"".join(server.wire) == chunk("a") + chunk("b") + chunk("c")


async def test_the_guard_tracks_bytes_written_by_nowait() -> None:
    """Bytes that went by nowait move the guard's line state: when the app then fails in the
    middle of an event, the terminal error event first ends that half-written event."""
    server = Server()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(START)
        await send(body(chunk("a")))
        assert app_nowait(scope)(b'data: {"half')
        raise RuntimeError("upstream broke mid-event")

    await drive(StreamGuard(app), server)
    wire = b"".join(server.wire)
    assert wire.startswith(chunk("a") + b'data: {"half\n\n')
    *_, (_, data, _) = parse(wire)
    assert '"error"' in data


async def test_nowait_is_refused_once_the_stream_was_stopped() -> None:
    """After an idle timeout stopped the stream, nowait refuses: the app's next `send`
    raises, so nothing is written after the terminal event."""
    server = Server()
    results: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(START)
        await send(body(chunk("a")))
        try:
            await asyncio.sleep(1)
        finally:
            results.append(app_nowait(scope)(chunk("late")))

    await drive(StreamGuard(app, idle_timeout=0.05, keepalive_interval=None), server)
    assert results == [False]
    assert chunk("late") not in b"".join(server.wire)


# --- the sidecar's HTTP/1.1 server (sidecar.servers.http1) ------------------------------


async def test_server_nowait_writes_chunked_frames_and_stops_at_flow_control() -> None:
    """Under the sidecar's uvicorn protocol the app's nowait writes well-formed chunked
    frames between `send`s; a client that reads nothing makes it refuse after a bounded
    amount (the transport's flow control), and the stream then ends normally by `send`."""
    taken: list[int] = []
    piece = b"data: " + b"x" * 65536 + b"\n\n"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(START)
        await send(body(chunk("a")))
        nowait = app_nowait(scope)
        assert nowait(chunk("b"))
        if scope["path"] == "/flood":
            total = 0
            while nowait(piece):
                total += len(piece)
                assert total < 64 * 1024 * 1024, "flow control never refused"
            taken.append(total)
        await send(body(chunk("c")))
        await send(body(b"", more=False))

    async with serve(StreamGuard(app), "sidecar") as port:
        response = await request(port, "GET", "/v1/chat/completions")
        text = await asyncio.wait_for(response.body(), 5)
        response.close()
        assert text == chunk("a") + chunk("b") + chunk("c")

        response = await request(port, "GET", "/flood")
        await asyncio.sleep(0.2)  # not reading: the socket buffers fill, then the transport's
        text = await asyncio.wait_for(response.body(), 10)
        response.close()
        assert len(taken) == 1 and taken[0] > 0
        assert text == chunk("a") + chunk("b") + piece * (taken[0] // len(piece)) + chunk("c")


async def test_server_nowait_refuses_after_the_client_left() -> None:
    """Once the client is gone the server's nowait writes nothing and says so."""
    after: list[bool] = []
    gone = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        nowait = app_nowait(scope)
        await send(START)
        await send(body(chunk("a")))
        with contextlib.suppress(asyncio.CancelledError):
            while (await receive())["type"] != "http.disconnect":
                pass
        after.append(nowait(chunk("b")))
        gone.set()

    async with serve(app, "sidecar") as port:
        response = await request(port, "GET", "/")
        assert await response.chunk() is not None
        response.close()
        await asyncio.wait_for(gone.wait(), 5)
    assert after == [False]


async def _idle_stream_tasks(server: str) -> int:
    """Tasks alive (beyond the servers' own) while one stream through the sidecar's app is
    idle; fails unless the client's close then ends the stream upstream."""
    stats = Stats()
    async with serve(make_app(stats=stats)) as upstream:
        settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
        async with serve(build_guard(settings, StreamRegistry()), server) as port:  # type: ignore[arg-type]
            baseline = len(asyncio.all_tasks())
            body = chat(tokens=1000, itl_ms=60_000)  # the first token, then a minute of silence
            response = await request(port, "POST", "/v1/chat/completions", body=body)
            try:
                assert await asyncio.wait_for(response.chunk(), 5) is not None
                await asyncio.sleep(0.05)
                tasks = len(asyncio.all_tasks()) - baseline
            finally:
                response.close()
            for _ in range(500):
                if stats.streams_cancelled:
                    break
                await asyncio.sleep(0.01)
    assert stats.streams_cancelled == 1, server
    return tasks


async def test_the_sidecars_server_tells_the_guard_of_a_disconnect() -> None:
    """Through the sidecar's server the guard takes the extension's `on_disconnect`: an idle
    stream keeps one task fewer than through uvicorn's own server (no extension), where the
    guard reads `receive()` with a watcher task; a client's close ends the upstream stream
    through either."""
    assert await _idle_stream_tasks("sidecar") == await _idle_stream_tasks("uvicorn-httptools") - 1


async def test_head_requests_get_no_nowait() -> None:
    """A HEAD response has no body to write, so the server does not offer the extension."""
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send(body(b"", more=False))

    async with serve(app, "sidecar") as port:
        for method in ("HEAD", "GET"):
            response = await request(port, method, "/")
            assert response.status == 200
            response.close()
    head, get = seen
    assert SEND_NOWAIT not in head.get("extensions", {})
    assert SEND_NOWAIT in get["extensions"]


# --- the upstream connection (sidecar.upstream.h1.Body.push_to) --------------------------------------


@pytest.mark.parametrize("accept", ["all", "none", "alternate"])
async def test_upstream_reads_go_to_the_sink_first_and_the_rest_in_order(accept: str) -> None:
    """Each read's body is offered to the sink; what it refuses comes out of the body
    iterator; together they are the whole body, in order, and the iterator ends."""
    consumed = asyncio.Queue[None]()  # the upstream writes a piece once the last one was taken
    pieces = [b"one,", b"two,", b"three,", b"four"]

    async def handler(conn: RawConnection) -> None:
        await conn.read_head()
        conn.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            await consumed.get()
            conn.writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await conn.writer.drain()
        await consumed.get()
        conn.writer.write(b"0\r\n\r\n")
        await conn.wait_eof()

    order: list[tuple[str, bytes]] = []

    def sink(data: bytes) -> bool:
        taken = accept == "all" or (accept == "alternate" and len(order) % 2 == 0)
        if taken:
            order.append(("sink", data))
            consumed.put_nowait(None)
        return taken

    async with RawUpstream(handler).running() as raw:
        pool = H1Pool("127.0.0.1", raw.port)
        try:
            async with pool.exchange(b"GET", b"/", [(b"host", b"x")]) as response:
                response.body.push_to(sink)  # type: ignore[attr-defined]
                consumed.put_nowait(None)  # the head is in: now the pieces, one read each
                async with asyncio.timeout(5):
                    async for data in response.body:
                        order.append(("iter", data))
                        consumed.put_nowait(None)
        finally:
            await pool.aclose()
    assert b"".join(data for _, data in order) == b"".join(pieces)
    expected = {
        "all": ["sink"] * 4,
        "none": ["iter"] * 4,
        "alternate": ["sink", "iter", "sink", "iter"],
    }[accept]
    assert [source for source, _ in order] == expected


# --- the whole sidecar: the push path is the one taken ---------------------------------------


async def through_the_sidecar(body: bytes, telemetry: Any = None) -> bytes:
    """One chat completion through the real stack (the sidecar's listener, StreamGuard, the
    proxy, the HTTP/1.1 pool, the emulator); returns the whole response body."""
    async with serve(make_app(stats=Stats())) as upstream:
        settings = load(["--upstream", f"http://127.0.0.1:{upstream}"], environ={})
        guard = build_guard(settings, StreamRegistry(), telemetry)
        async with serve(guard, "sidecar") as port:
            response = await request(port, "POST", "/v1/chat/completions", body=body)
            try:
                text = await asyncio.wait_for(response.body(), 10)
            finally:
                response.close()
    return text


async def test_the_sidecar_relays_paced_tokens_from_the_protocol_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real stack (sidecar listener, StreamGuard, proxy, HTTP/1.1 pool, emulator),
    tokens that arrive one read at a time are written by `send_nowait`, not by waking the
    request task for `send`: a change that silently loses the fast path fails here."""
    from middleware.cycle import Cycle

    pushed: list[int] = []
    sent: list[int] = []
    nowait, send = Cycle.send_nowait, Cycle.send

    def counting_nowait(self: Cycle, body: bytes) -> bool:
        taken = nowait(self, body)
        if taken:
            pushed.append(len(body))
        return taken

    async def counting_send(self: Cycle, message: Message) -> None:
        if message.get("body"):
            sent.append(len(message["body"]))
        await send(self, message)

    monkeypatch.setattr(Cycle, "send_nowait", counting_nowait)
    monkeypatch.setattr(Cycle, "send", counting_send)
    text = await through_the_sidecar(chat(tokens=20, itl_ms=10))
    assert text.endswith(b"data: [DONE]\n\n")
    assert len(pushed) >= 15, (pushed, sent)  # the first read and the last may go by send
    assert len(sent) <= 4, (pushed, sent)


@pytest.mark.parametrize("stamp", [False, True], ids=["vllm-tail", "stamped-tail"])
async def test_with_telemetry_paced_tokens_are_counted_by_the_learned_frame(
    monkeypatch: pytest.MonkeyPatch, stamp: bool
) -> None:
    """Telemetry's per-token work through the real stack is one check against the stream's
    learned frame: the slow path (`ObservedCycle._observe`: scanner, JSON) runs only for the first
    chunks and the end, whether each chunk's tail is the same (vLLM) or changes (the
    emulator's timestamp, OpenAI's obfuscation). A change that loses the fast path — and
    quietly multiplies telemetry's cost per token — fails here; the counts stay exact."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from middleware.telemetry import Telemetry
    from middleware.telemetry.observed import ObservedCycle
    from middleware.telemetry.record import StreamRecord

    slow: list[int] = []
    observe, start = ObservedCycle._observe, ObservedCycle.__init__

    def counting(self: ObservedCycle, body: bytes, now: float, stats: Any) -> None:
        slow.append(len(body))
        observe(self, body, now, stats)

    records: list[StreamRecord] = []

    def keeping(self: ObservedCycle, *args: Any) -> None:
        start(self, *args)
        records.append(self.record)

    monkeypatch.setattr(ObservedCycle, "_observe", counting)
    monkeypatch.setattr(ObservedCycle, "__init__", keeping)
    telemetry = Telemetry(metric_readers=[InMemoryMetricReader()])
    body = json.loads(chat(tokens=30, itl_ms=5))
    body["sidestream"]["stamp"] = stamp
    text = await through_the_sidecar(json.dumps(body).encode(), telemetry)
    assert text.endswith(b"data: [DONE]\n\n")
    assert (b'"sidestream_sent_ns"' in text) is stamp
    assert len(slow) <= 4, slow  # role chunk, the first token (learns the frame), the end
    (stream,) = records
    stream.gaps.fold()
    assert stream.gaps.count == 29  # every token's time kept: 30 tokens, 29 gaps


# --- resumable streams: a long chunk in slices ---------------------------------------------


async def test_a_resumable_streams_long_chunk_goes_in_slices_that_nothing_overtakes() -> None:
    """With resume on, a chunk longer than the slice bound (`SLICE_BYTES`) is refused by nowait
    and written by `send` in slices of whole lines, each within the bound plus the ids the
    stamper adds, in loop turns of their own; a nowait chunk offered between them is refused
    (it would overtake the rest) and goes after it. Every event arrives once, in order, with
    its id."""
    server = Server()
    events = [chunk(f"t{n:04d}") for n in range(3 * SLICE_BYTES // len(chunk("t0000")))]
    during: list[bool] = []
    turn = 0
    turns: list[int] = []  # the loop turn each body piece was written in

    def next_turn() -> None:
        nonlocal turn
        turn += 1
        if turn < 1000:
            asyncio.get_running_loop().call_soon(next_turn)

    plain_send = server.send

    async def send_counted(message: Message) -> None:
        if message.get("body"):
            turns.append(turn)
        await plain_send(message)

    server.send = send_counted  # type: ignore[method-assign]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nowait = app_nowait(scope)
        await send(START)
        await send(body(events[0]))
        assert not nowait(b"".join(events[1:-1]))  # longer than the bound: refused
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: during.append(nowait(events[-1])))  # offered between slices
        next_turn()
        await send(body(b"".join(events[1:-1])))
        if not during[0]:
            await send(body(events[-1]))
        await send(body(b"", more=False))

    await drive(StreamGuard(app, resume=True), server)
    assert during == [False]
    sizes = [len(piece) for piece in server.wire if piece]
    assert len(sizes) >= 5  # the first event, three slices or more, the last event
    id_room = 64 * (SLICE_BYTES // len(events[0]) + 1)  # "id: <stream>:<n>\n" per event
    assert max(sizes) <= SLICE_BYTES + id_room
    slices = turns[1:-1]
    assert len(set(slices)) == len(slices)  # each slice in a loop turn of its own
    got = parse(b"".join(server.wire))
    assert [data for _, data, _ in got] == [e[len(b"data: ") : -2].decode() for e in events]
    ids = [int(last_id.rsplit(":", 1)[1]) for _, _, last_id in got]
    assert ids == list(range(1, len(events) + 1))


async def test_a_resumable_streams_single_long_event_is_cut_mid_line_and_arrives_whole() -> None:
    """Rule: an event longer than the slice bound with no line end inside a slice (one long
    data line: a tool call's arguments, say) is cut where the bound falls, and the reader gets
    it whole, once, with one id, as if it had come in one piece."""
    server = Server()
    data = "x" * (3 * SLICE_BYTES + 17)
    event = b"data: %b\n\n" % data.encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(START)
        await send(body(event))
        await send(body(b"", more=False))

    await drive(StreamGuard(app, resume=True), server)
    pieces = [piece for piece in server.wire if piece]
    assert len(pieces) >= 4 and max(map(len, pieces)) <= SLICE_BYTES + 64
    ((_, got, last_id),) = parse(b"".join(server.wire))
    assert got == data and last_id.endswith(":1")
