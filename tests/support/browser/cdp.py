"""Drive headless Chromium over the DevTools protocol: open a page, wait for `window.result`.

No Playwright and no browser download: Debian's `chromium` (installed by `make test-deps`) with
`--remote-debugging-port=0`, the page target's WebSocket (the `websockets` package that
uvicorn[standard] brings) and three protocol methods. A missing Chromium fails the test in one
line (`tools.tool`), one that does not start raises `BrowserUnavailable`: never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import tempfile
from typing import Any

import httpx
import websockets

from tests.support.tools import tool

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)


class BrowserUnavailable(RuntimeError):
    """Chromium is not installed or did not start."""


def chromium() -> str:
    return tool("chromium", "chromium-browser", "google-chrome")


async def _devtools_port(stderr: asyncio.StreamReader) -> int:
    while line := await stderr.readline():
        if match := re.search(rb"DevTools listening on ws://[^:]+:(\d+)/", line):
            return int(match.group(1))
    raise BrowserUnavailable("chromium exited before its DevTools endpoint was up")


async def open_page(url: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """Load `url` in a fresh headless Chromium; return `window.result` once it has `done`."""
    with tempfile.TemporaryDirectory(prefix="sidestream-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stderr is not None
        drain: asyncio.Task[bytes] | None = None
        try:
            try:
                port = await asyncio.wait_for(_devtools_port(process.stderr), 20)
            except TimeoutError:
                raise BrowserUnavailable("chromium did not open DevTools in 20 s") from None
            drain = asyncio.create_task(process.stderr.read())  # never let the pipe fill
            async with httpx.AsyncClient() as http:
                targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            page = next(t for t in targets if t["type"] == "page")
            async with websockets.connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
                ids = itertools.count(1)

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    message_id = next(ids)
                    await ws.send(
                        json.dumps({"id": message_id, "method": method, "params": params})
                    )
                    while True:
                        reply = json.loads(await ws.recv())
                        if reply.get("id") == message_id:
                            if "error" in reply:
                                raise RuntimeError(f"{method}: {reply['error']}")
                            return dict(reply["result"])

                await call("Page.navigate", url=url)
                expression = (
                    "window.result && window.result.done ? JSON.stringify(window.result) : ''"
                )
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while loop.time() < deadline:
                    value = (await call("Runtime.evaluate", expression=expression))["result"]
                    if value.get("value"):
                        return dict(json.loads(value["value"]))
                    await asyncio.sleep(0.1)
                raise TimeoutError(f"the page did not finish within {timeout} s")
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
            if drain is not None:
                with contextlib.suppress(Exception):
                    await drain
