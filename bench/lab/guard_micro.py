"""StreamGuard's own cost per relayed chunk, at the ASGI level (no sockets, no server).

`python -m bench.lab.guard_micro` pushes 100,000 OpenAI chat chunks from an app to a no-op
`send`: bare, wrapped in StreamGuard with telemetry off, and with telemetry on (a span and
metrics per stream, every event observed). It prints CPU microseconds per chunk.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from middleware.guard import StreamGuard

N = 100_000
CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}\n\n'
)
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for _ in range(N):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def per_chunk(target: Any) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    started = time.process_time()
    await target(dict(SCOPE), receive, send)
    return (time.process_time() - started) / N * 1e6


async def main() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from middleware.telemetry import Telemetry

    telemetry = Telemetry(tracer_provider=TracerProvider(), metric_readers=[InMemoryMetricReader()])
    bare = min([await per_chunk(app) for _ in range(3)])
    guarded = min([await per_chunk(StreamGuard(app)) for _ in range(3)])
    observed = min([await per_chunk(StreamGuard(app, telemetry=telemetry)) for _ in range(3)])
    print(
        f"bare {bare:.2f} us/chunk; guard, telemetry off +{guarded - bare:.2f} us/chunk; "
        f"telemetry on +{observed - bare:.2f} us/chunk"
    )


if __name__ == "__main__":
    asyncio.run(main())
