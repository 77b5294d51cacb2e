"""Small ASGI apps that play a streaming inference server in StreamGuard's tests.

Each app takes a script of (pause seconds, bytes) steps and records what happened to it
(cancelled or not, and when), so a test can see the app side of every rule.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from middleware.types import Message, Receive, Scope, Send

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson")]

Script = Sequence[tuple[float, bytes]]

# A chat-completions request as a server would pass it, for tests that drive an app by hand.
SCOPE: Scope = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/chat/completions",
    "raw_path": b"/v1/chat/completions",
    "query_string": b"",
    "headers": [(b"host", b"test")],
}


@dataclass
class Probe:
    """What the app saw: when it finished or was cancelled, what it received, what it sent."""

    started: float | None = None
    cancelled_at: float | None = None
    finished: bool = False
    received: list[Message] = field(default_factory=list)
    sent_bytes: int = 0
    event: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self.event.wait(), timeout)


def chunk(content: str, index: int = 0) -> bytes:
    """One OpenAI chat-completions content chunk."""
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":'
        b'[{"index":%d,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
        % (index, content.encode())
    )


ROLE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
)
DONE = b"data: [DONE]\n\n"


def scripted(
    script: Script,
    probe: Probe | None = None,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    status: int = 200,
    pause_before_headers: float = 0.0,
    read_body: bool = True,
    fail_after: bool = False,
) -> object:
    """An ASGI app that sends `script` as a streaming response."""
    probe = probe if probe is not None else Probe()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        probe.started = time.monotonic()
        try:
            if read_body:
                while True:
                    message = await receive()
                    probe.received.append(message)
                    if not message.get("more_body", False):
                        break
            if pause_before_headers:
                await asyncio.sleep(pause_before_headers)
            await send(
                {"type": "http.response.start", "status": status, "headers": headers or SSE_HEADERS}
            )
            for pause, data in script:
                if pause:
                    await asyncio.sleep(pause)
                await send({"type": "http.response.body", "body": data, "more_body": True})
                probe.sent_bytes += len(data)
            if fail_after:
                raise RuntimeError("the app broke mid-stream")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            probe.finished = True
        except asyncio.CancelledError:
            probe.cancelled_at = time.monotonic()
            raise
        finally:
            probe.event.set()

    return app
