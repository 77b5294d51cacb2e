"""The emulator's CLI as a process: bad flags, and serving on a Unix socket."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.sockets.test_emulator import FAST, MESSAGES, module_loop


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.emulator", *args],
        capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[2],
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [["--listen", "nope"], ["--listen", "127.0.0.1:99999"], ["--log-level", "loud"], ["--what"]],
)
def test_cli_bad_flag_exits_2_with_one_line(args: list[str]) -> None:
    """A bad flag value exits 2 with a single error line on stderr."""
    result = run_cli(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "error" in result.stderr


@module_loop
async def test_cli_serves_on_unix_socket(tmp_path: Path) -> None:
    """`python -m sidecar.emulator --uds PATH` serves the emulator on that Unix socket."""
    uds = tmp_path / "emu.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar.emulator", "--uds", str(uds),
        stderr=subprocess.DEVNULL, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        for _ in range(1000):
            if uds.exists():
                break
            await asyncio.sleep(0.01)
        transport = httpx.AsyncHTTPTransport(uds=str(uds))
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"messages": MESSAGES, "max_tokens": 2, "sidestream": FAST},
            )
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "A language"
    finally:
        proc.terminate()
        await proc.wait()
