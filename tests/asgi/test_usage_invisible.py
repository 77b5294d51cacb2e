"""Forced usage through the real relay path (StreamGuard over a scripted OpenAI-style server):
a client that did not ask reads, under `force` and `continuous`, the bytes it reads under
`pass` — the unforced stream — for every framing and any split across reads; a client that
asked reads the server's own bytes, usage chunk and `"usage":null` members included.

The hand-written server offers `SEND_NOWAIT`, as the sidecar's does, and refuses some writes
(flow control): the relay then undoes the edit's call and sends that read by `send`, so both
of the relay's paths, and the edit's `undo`, carry the stream. Each example runs with the
compiled `hide` and without it; the relay's own core is the one this run of the suite picked.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middleware import usage_hide
from middleware.guard import StreamGuard
from middleware.types import SEND_NOWAIT, Message
from tests.support.apps import SCOPE
from tests.support.compiled import built
from tests.support.fuzzing import examples
from tests.support.usage_streams import QUIRKS, Script, ScriptedServer, scripts

compiled = built("middleware._usage")
MODES = ("pass", "force", "continuous")


def body(asked: bool) -> bytes:
    request: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user"}]}
    if asked:
        request["stream_options"] = {"include_usage": True}
    return json.dumps(request).encode()


class Server:
    """One request through an app: its body, then a client that stays; what the client
    read, by `send` and by `SEND_NOWAIT` alike, in order. `refusals` says which nowait
    writes are refused (cycled)."""

    def __init__(self, request: bytes, refusals: list[bool]) -> None:
        self.request, self.refusals, self.calls = request, refusals or [False], 0
        self.read: list[bytes] = []
        self.scope = {
            **SCOPE,
            "headers": [(b"host", b"t"), (b"content-length", b"%d" % len(request))],
            "extensions": {SEND_NOWAIT: {"send": self.nowait}},
        }
        self.stay = asyncio.Event()

    def nowait(self, data: bytes) -> bool:
        self.calls += 1
        if self.refusals[self.calls % len(self.refusals)]:
            return False
        self.read.append(data)
        return True

    async def receive(self) -> Message:
        if self.request is not None:
            request, self.request = self.request, None  # type: ignore[assignment]
            return {"type": "http.request", "body": request, "more_body": False}
        await self.stay.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.read.append(message.get("body", b""))


async def read(script: Script, mode: str, asked: bool, refusals: list[bool]) -> bytes:
    app = ScriptedServer(script)
    server = Server(body(asked), refusals)
    guard = StreamGuard(app, usage=mode, keepalive_interval=None)
    await asyncio.wait_for(guard(server.scope, server.receive, server.send), 10)
    assert app.asked == [(asked or mode != "pass", mode == "continuous" and not asked)]
    return b"".join(server.read)


async def check(script: Script, refusals: list[bool]) -> None:
    for use in (compiled, None):
        saved, usage_hide._compiled = usage_hide._compiled, use
        try:
            for mode in MODES:
                got = await read(script, mode, False, refusals)
                assert got == script.stream(False, False), (mode, use)
                assert await read(script, mode, True, refusals) == script.stream(True, False)
        finally:
            usage_hide._compiled = saved


@settings(max_examples=examples(150), deadline=None)
@given(scripts(), st.lists(st.booleans(), max_size=5))
def test_any_framing_reads_the_same_in_every_usage_mode(
    script: Script, refusals: list[bool]
) -> None:
    """Property: whatever the framing and the splits, the client that did not ask reads the
    unforced stream in all three modes; the client that asked reads the server's bytes."""
    asyncio.run(check(script, refusals))


@pytest.mark.parametrize("name", list(QUIRKS))
async def test_each_quirk_reads_the_same_in_every_usage_mode(name: str) -> None:
    """The named quirks of issue 47, through the relay, with some writes refused."""
    await check(QUIRKS[name], [False, True, False])
