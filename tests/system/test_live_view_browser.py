"""The live view in a real browser: headless Chromium opens the sidecar's admin `/`, the rows
of the streams in flight appear over the page's SSE feed, a stream that stalls is marked
stuck within a few seconds, and a finished one leaves. A screenshot is kept under the test's
output (and in $SIDESTREAM_SCREENSHOT_DIR when set: how docs/img/live-view.png is made).
Chromium missing is a failure here, not a skip: `make test-deps` installs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path

from sidecar.emulator import Stats, make_app
from tests.support.browser.session import browser_page
from tests.support.clients import request
from tests.support.procs import Child
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
ROWS = (
    "[...document.querySelectorAll('#rows tr')].map(r => "
    "({id: r.dataset.requestId, stuck: r.classList.contains('stuck')}))"
)


def chat(model: str, tokens: int, ttft_ms: int, itl_ms: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "sidestream": {"tokens": tokens, "ttft_ms": ttft_ms, "itl_ms": itl_ms},
        }
    ).encode()


async def stream(port: int, request_id: str, body: bytes) -> None:
    response = await request(port, "POST", CHAT, body=body, headers=[("X-Request-ID", request_id)])
    try:
        await response.body()
    finally:
        response.close()


async def test_chromium_shows_streams_marks_the_stuck_one_and_drops_the_finished(
    tmp_path: Path,
) -> None:
    """In Chromium: rows for the streams in flight, the stalled one marked stuck (no chunk
    for longer than the 0.5 s keep-alive interval) and listed first, the flowing ones not;
    once the short stream ends its row leaves."""
    async with serve(make_app(stats=Stats())) as upstream:
        sidecar = Child(upstream, "--keepalive-interval", "0.5")
        tasks: list[asyncio.Task[None]] = []
        try:
            await sidecar.ready()
            async with browser_page() as page:
                await page.navigate(f"http://127.0.0.1:{sidecar.admin}/", 1280, 420)
                await page.wait_for("window.snapshots >= 1")
                bodies = {
                    "chat-7f3a-short": chat("llama-3-8b", 30, 100, 100),
                    "chat-91c2-long": chat("llama-3-8b", 150, 150, 80),
                    "chat-4be0-prefill": chat("qwen2-7b", 80, 1500, 60),
                    "chat-c5d1-stalled": chat("qwen2-7b", 3, 12000, 10),
                }
                tasks = [
                    asyncio.create_task(stream(sidecar.port, rid, body))
                    for rid, body in bodies.items()
                ]
                await page.wait_for(f"{ROWS}.length === 4", timeout=10)
                rows = await page.wait_for(
                    f"(r => r[0].stuck && r[0].id === 'chat-c5d1-stalled' && r)({ROWS})",
                    timeout=5,
                )
                await page.wait_for("window.snapshots >= 4", timeout=10)
                rows = await page.evaluate(ROWS)
                shot = await page.screenshot(tmp_path / "live-view.png")
                stuck = {row["id"] for row in rows if row["stuck"]}
                assert "chat-c5d1-stalled" in stuck
                assert not stuck & {"chat-7f3a-short", "chat-91c2-long"}
                await page.wait_for(f"!{ROWS}.some(r => r.id === 'chat-7f3a-short')", timeout=10)
                left = {row["id"] for row in await page.evaluate(ROWS)}
                assert "chat-c5d1-stalled" in left and "chat-7f3a-short" not in left
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            sidecar.kill()
    assert shot.stat().st_size > 10_000
    if target := os.environ.get("SIDESTREAM_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(target) / "live-view.png")
