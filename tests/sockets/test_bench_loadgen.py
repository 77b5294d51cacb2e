"""The load generator's interleaving (`bench.loadgen`, `ports`): what `bench.ttft` relies on to
let every moment of the machine fall on all targets alike."""

from __future__ import annotations

import time

from bench.loadgen import run_streams
from middleware.types import ASGIApp, Receive, Scope, Send
from tests.support.servers import serve


def answering(name: bytes) -> ASGIApp:
    """An app that streams one stamped token, then [DONE], and says who it is."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await receive()
        headers = [(b"content-type", b"text/event-stream"), (b"x-name", name)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        token = b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % time.monotonic_ns()
        await send({"type": "http.response.body", "body": token, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


async def test_streams_go_to_each_port_in_turn_and_say_which() -> None:
    """With `ports`, stream i goes to ports[i % n] (one lane: strictly in turn), and each
    record ends with the port it went to; each got its first token."""
    async with serve(answering(b"a")) as first, serve(answering(b"b")) as second:
        cfg = {"concurrency": 1, "streams": 6, "tokens": 1, "stamp": "content"}
        result = await run_streams({**cfg, "ports": [first, second]})
    records = result["streams"]
    assert [record[-1] for record in records] == [first, second] * 3
    assert all(record[0] > 0 and record[1] == 1 and record[3] == 1 for record in records)
    assert len(result["latencies_ns"]) == 6


async def test_one_port_keeps_the_records_as_they_were() -> None:
    """Without `ports`, records carry no port (the scenarios read them by position)."""
    async with serve(answering(b"a")) as port:
        result = await run_streams({"concurrency": 1, "streams": 2, "tokens": 1, "port": port})
    assert [len(record) for record in result["streams"]] == [6, 6]
