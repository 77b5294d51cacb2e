"""Resume in a real browser: headless Chromium (DevTools protocol, `tests/support/browser/`)
reads a stream from the sidecar with `--resume`, through a relay that drops the first
connection of each reader mid-stream (`tests/support/cutter.py`). The page is served from the
sidecar's own origin, so `Last-Event-ID` needs no CORS preflight."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from middleware.registry import StreamRegistry
from middleware.types import Receive, Scope, Send
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.browser.cdp import open_page
from tests.support.cutter import cutter
from tests.support.servers import serve

PAGE = (Path(__file__).parents[1] / "support" / "browser" / "resume.html").read_bytes()
TOKENS = 16


def with_page(app: Any) -> Any:
    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/resume.html":
            headers = [(b"content-type", b"text/html; charset=utf-8"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": PAGE})
            return
        await app(scope, receive, send)

    return routed


def check(events: list[dict[str, Any]], stats: Stats) -> None:
    stream_id = events[0]["id"].rpartition(":")[0]
    assert [e["id"] for e in events] == [f"{stream_id}:{n}" for n in range(1, len(events) + 1)]
    assert events[-1]["data"] == "[DONE]"
    contents = [e for e in events if '"content"' in e["data"] and '"role"' not in e["data"]]
    assert len(contents) == TOKENS


async def test_chromium_eventsource_and_fetch_reader_resume_with_no_gap_or_duplicate() -> None:
    """Rule: after the connection is dropped mid-stream, Chromium's EventSource reconnects by
    itself and resumes from the store with no duplicate and no gap; a fetch reader resumes by
    `Last-Event-ID`; the upstream generates each stream once."""
    stats = Stats()
    async with serve(make_app(stats=stats)) as upstream:
        flags = ["--upstream", f"http://127.0.0.1:{upstream}", "--resume"]
        sidecar = build_guard(load(flags, environ={}), StreamRegistry())
        async with serve(with_page(sidecar), "sidecar") as port, cutter(port, 1500) as relay:
            relay_port, cut = relay
            query = urlencode({"tokens": TOKENS, "ttft_ms": 0, "itl_ms": 250})
            result = await open_page(
                f"http://127.0.0.1:{relay_port}/resume.html?{urlencode({'q': query})}", timeout=40
            )
    assert result["errors"] == []
    fetched, source = result["fetch"], result["eventsource"]
    assert fetched["attempts"] == 2 and fetched["streamId"]
    check(fetched["events"], stats)
    assert source["opens"] >= 2
    check(source["events"], stats)
    assert len(cut) == 2 and stats.streams_started == 2
