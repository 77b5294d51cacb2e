"""The drain hook the injector adds to the app container: its preStop script run as a process
against an admin port served in the test."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from sidecar.injector.patch import _DRAIN_SCRIPT
from tests.support.servers import serve

JSON = dict[str, Any]


async def test_drain_hook_posts_drain_then_waits_for_the_sidecar_to_exit() -> None:
    """The app container's preStop script POSTs /drain, then returns once the admin port
    stops answering (the sidecar exited), well before its wait budget."""
    seen: list[tuple[str, str]] = []
    stopped = asyncio.Event()

    async def admin(scope: JSON, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope["method"], scope["path"]))
        await send(
            {
                "type": "http.response.start",
                "status": 202 if scope["path"] == "/drain" else 200,
                "headers": [],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        if scope["path"] == "/livez":
            stopped.set()  # the sidecar "exits" after its first post-drain health check

    async with serve(admin) as port:
        script = _DRAIN_SCRIPT.format(admin_port=port, propagation=0, wait=30)
        hook = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
        await asyncio.wait_for(stopped.wait(), 10)
    # The server is gone: the hook's next /livez fails and it returns at once.
    assert await asyncio.wait_for(hook.wait(), 10) == 0
    assert seen[:2] == [("POST", "/drain"), ("GET", "/livez")]
