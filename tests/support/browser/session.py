"""A headless Chromium page to look at over time: navigate, evaluate, wait, screenshot.

`cdp.open_page` waits for one `window.result`; a live page (the admin's live view, a
rendered dashboard) is watched instead: `Page` evaluates expressions until one holds and
captures PNG screenshots. Same Chromium, flags and DevTools plumbing as `cdp`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import websockets

from tests.support.browser.cdp import FLAGS, BrowserUnavailable, _devtools_port, chromium


class Page:
    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self._ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply["result"])

    async def navigate(self, url: str, width: int = 1280, height: int = 720) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` in the page (None if it throws)."""
        reply = await self.call(
            "Runtime.evaluate", expression=f"JSON.stringify({expression})", returnByValue=True
        )
        value = reply["result"].get("value")
        return None if value is None else json.loads(value)

    async def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Evaluate `expression` every 0.1 s until it is truthy; return that value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{expression!r} did not hold within {timeout} s")

    async def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = (await self.call("Page.getLayoutMetrics"))["cssContentSize"]
            params["clip"] = {
                "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1,
            }  # fmt: skip
            params["captureBeyondViewport"] = True
        data = (await self.call("Page.captureScreenshot", **params))["data"]
        await asyncio.to_thread(_write, path, base64.b64decode(data))
        return path


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@contextlib.asynccontextmanager
async def browser_page() -> AsyncIterator[Page]:
    """A fresh headless Chromium with one blank page; closed on exit."""
    with tempfile.TemporaryDirectory(prefix="sidestream-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            chromium(),
            *FLAGS,
            "--hide-scrollbars",
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
            drain = asyncio.create_task(process.stderr.read())
            async with httpx.AsyncClient() as http:
                targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            target = next(t for t in targets if t["type"] == "page")
            async with websockets.connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
                yield Page(ws)
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
            if drain is not None:
                with contextlib.suppress(Exception):
                    await drain
