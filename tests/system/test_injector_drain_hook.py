"""The drain hook the injector gives the native sidecar: its preStop script run as a process,
as the kubelet runs it inside the sidecar's container, against a real sidecar process."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest

from sidecar.emulator import Stats, make_app
from sidecar.injector.drain import DRAIN_SCRIPT
from tests.support.procs import Child, free_port
from tests.support.servers import serve


@pytest.fixture
async def emulator() -> AsyncIterator[int]:
    async with serve(make_app(stats=Stats())) as port:
        yield port


async def run_hook(admin_port: int) -> int:
    """The hook's exit status (the endpoint-propagation wait left out)."""
    script = DRAIN_SCRIPT.format(admin_port=admin_port, propagation=0)
    hook = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    return await asyncio.wait_for(hook.wait(), 10)


async def test_the_hook_drains_the_sidecar_over_loopback_and_returns_at_once(
    emulator: int,
) -> None:
    """Rule: the hook POSTs /drain to the admin port on loopback (where it answers without a
    token) and returns 0 without waiting for the drain; the sidecar then drains and exits 0
    by itself."""
    child = Child(emulator)
    try:
        await child.ready()
        assert await run_hook(child.admin) == 0
        assert await child.exit_code(20) == 0
    finally:
        child.kill()


async def test_the_hook_returns_when_nothing_answers() -> None:
    """Rule: a sidecar that is gone (or has no admin listener) never keeps the pod: the hook
    swallows the refused connection and returns 0 within its 2 s bound."""
    assert await run_hook(free_port()) == 0  # within run_hook's 10 s wait
