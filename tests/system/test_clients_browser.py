"""A real browser through the sidecar: headless Chromium, driven over the DevTools protocol.

`tests/support/browser/page.html` is served from its own origin by a tiny ASGI app and reads the
sidecar's stream (the emulator's `GET /v1/stream`, which allows any origin) two ways:
`fetch` with a `ReadableStream` reader and `TextDecoder({stream: true})`, and `EventSource`.
The sidecar runs with `--max-duration 1` so the EventSource's stream is cut mid-way, and
the browser's reconnect must carry `Last-Event-ID` through the sidecar to the emulator.
Chromium missing is a failure here, not a skip: `make test-deps` installs it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.browser.cdp import open_page
from tests.support.servers import serve

PAGE = (Path(__file__).parents[1] / "support" / "browser" / "page.html").read_bytes()
TEXT = "नमस्ते दुनिया! यह हिन्दी में एक धारा है 👋🏽 टोकन 🚀 एक-एक करके आते हैं 🙂 ✅"


async def page_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", b"%d" % len(PAGE)),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": PAGE})


async def test_chromium_reads_the_stream_by_fetch_and_eventsource() -> None:
    """In Chromium: tokens arrive spread over time, Hindi and emoji intact (fetch); EventSource
    reconnects after the stream is cut and its Last-Event-ID reaches the upstream, which resumes."""
    stats = Stats()
    async with serve(make_app(stats=stats)) as upstream:
        flags = ["--upstream", f"http://127.0.0.1:{upstream}", "--max-duration", "1"]
        flags += ["--keepalive-interval", "0.05"]
        sidecar = build_guard(load(flags, environ={}), StreamRegistry())
        async with serve(sidecar, "sidecar") as port, serve(page_app) as page_port:
            query = {
                "base": f"http://127.0.0.1:{port}",
                "qf": urlencode({"text": TEXT, "ttft_ms": 0, "itl_ms": 50}),
                "qe": urlencode({"tokens": 12, "ttft_ms": 0, "itl_ms": 150}),
            }
            result = await open_page(f"http://127.0.0.1:{page_port}/?{urlencode(query)}")
    assert result["errors"] == []

    fetched = result["fetch"]
    assert fetched["status"] == 200
    assert "".join(token["text"] for token in fetched["tokens"]) == TEXT
    times = [token["t"] for token in fetched["tokens"]]
    assert len(times) >= 10 and times[-1] - times[0] > 300  # ms: one by one, not one burst

    source = result["eventsource"]
    assert source["opens"] >= 2  # cut by --max-duration, then reconnected
    tokens = [e for e in source["events"] if e["data"] != "[DONE]" and '"error"' not in e["data"]]
    ids = [int(e["id"]) for e in tokens if e["id"]]  # the error event repeats the last id
    assert ids == sorted(set(ids)) and ids[0] == 0 and ids[-1] == 12  # resumed, none repeated
    assert any('"max_duration"' in e["data"] for e in source["events"])  # the terminal event
    assert source["events"][-1]["data"] == "[DONE]"
    assert stats.last_event_id is not None and 0 <= int(stats.last_event_id) < 12
