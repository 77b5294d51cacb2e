"""llama.cpp's server (llama-cpp-python's `python -m llama_cpp.server`) and the sidecar in
front of it, as child processes on 127.0.0.1 free ports, with their output in files.

`make test-deps` installs `llama-cpp-python[server]` (the `llamacpp` extra, built from source);
a machine without it fails these tests with `require_llama_cpp()`'s message instead of skipping
them.

Behaviour of llama-cpp-python's server (0.3.x) the tests and the recipe rely on:
- the port opens only once the model is loaded (`create_app` loads it before uvicorn starts);
- one model, one lock: a request holds the lock while it generates, and the next one waits
  for it (one slot). `--interrupt_requests` (on by default) makes a waiting request stop
  the running stream instead: a readiness probe on `/v1/models`, which takes the lock, would
  cut streams short, so the tests and the recipe turn it off;
- a client that goes away is seen after the token being computed: the server prints
  "Disconnected from client" and stops generating;
- it has no `/health` (404). `/v1/models` takes the model lock; `/openapi.json` (FastAPI's
  own route) does not, and like every route it answers only once the model is loaded.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import request
from tests.support.procs import free_port, later_port

ALIAS = "tiny"
# The health path the recipe gives: served without the model lock, so a probe neither waits
# for a running stream nor (with --interrupt_requests on) cuts it short, as /v1/models does.
HEALTH_PATH = "/openapi.json"
# The `llamacpp` extra: the server, and what `tests.support.tinymodel` writes its model with.
SERVER_MODULES = ("llama_cpp", "llama_cpp.server", "sse_starlette", "pydantic_settings", "gguf")


def require_llama_cpp() -> None:
    """Fail (not skip), in one line, when the `llamacpp` extra is not installed."""
    missing = [m for m in SERVER_MODULES if not _importable(m)]
    if missing:
        pytest.fail(
            f"the `llamacpp` extra is not installed ({', '.join(missing)} missing): "
            "`make test-deps` installs it (pip builds llama.cpp, minutes the first time)",
            pytrace=False,
        )


def _importable(name: str) -> bool:
    """Can `name` be imported? Found without importing it or the packages above it: importing
    `llama_cpp` opens /dev/null twice for the process's life (`llama_cpp._utils`), which was
    the ResourceWarning printed at the suite's exit."""
    return _spec(name) is not None


def _spec(name: str) -> importlib.machinery.ModuleSpec | None:
    parent, _, last = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    above = _spec(parent)
    places = None if above is None else above.submodule_search_locations
    return None if places is None else importlib.machinery.PathFinder.find_spec(last, places)


class Process:
    """A child process whose stdout and stderr go to one file (read back with `output`)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env={**clean, **(env or {})}
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    async def wait_output(self, text: str, timeout: float) -> float:
        """Wait until `text` is in the output; return when it was seen (monotonic)."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} not in the output:\n{self.output()[-3000:]}")
            await asyncio.sleep(0.01)
        return time.monotonic()

    async def exit_code(self, timeout: float) -> int:
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.process.wait), timeout)
        except TimeoutError:
            return -999

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.process.kill()
            self.process.wait()


class LlamaServer(Process):
    """`python -m llama_cpp.server` serving `model` as `tiny`, on one thread."""

    def __init__(self, model: Path, log: Path, *, n_ctx: int = 512, port: int = 0) -> None:
        self.port = port or later_port()  # bound once the model is loaded
        super().__init__(
            [
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(model),
                "--model_alias", ALIAS,
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--n_ctx", str(n_ctx),
                "--n_threads", "1",
                "--n_threads_batch", "1",
                "--interrupt_requests", "false",
                "--seed", "0",
            ],
            log,
        )  # fmt: skip

    async def ready(self, timeout: float = 60.0) -> None:
        """Wait until `/v1/models` answers 200 (the model is loaded and the port open)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(), f"llama_cpp.server exited:\n{self.output()[-3000:]}"
            try:
                status, _ = await get(self.port, "/v1/models")
            except OSError:
                await asyncio.sleep(0.05)
                continue
            if status == 200:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"llama_cpp.server not ready:\n{self.output()[-3000:]}")


class Sidecar(Process):
    """`python -m sidecar` in front of `upstream_port`, its access lines on stdout."""

    def __init__(
        self,
        upstream_port: int,
        log: Path,
        *flags: str,
        health: str = HEALTH_PATH,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port, self.admin = free_port(), free_port()
        super().__init__(
            [
                sys.executable, "-m", "sidecar",
                "--listen", f"127.0.0.1:{self.port}",
                "--admin-listen", f"127.0.0.1:{self.admin}",
                "--upstream", f"http://127.0.0.1:{upstream_port}",
                "--upstream-health", health,
                "--log-level", "warning",
                *flags,
            ],
            log,
            env,
        )  # fmt: skip

    async def ready(self, timeout: float = 20.0) -> None:
        """Wait until both the admin and the traffic port accept connections."""
        deadline = time.monotonic() + timeout
        for port in (self.admin, self.port):
            while True:
                assert self.alive(), f"the sidecar exited:\n{self.output()[-3000:]}"
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the sidecar did not start") from None
                    await asyncio.sleep(0.025)
                    continue
                writer.close()
                break

    def access_lines(self) -> list[dict[str, Any]]:
        lines = self.output().splitlines()
        return [json.loads(line) for line in lines if line.startswith('{"time"')]

    async def access_line(self, count: int = 1, timeout: float = 5.0) -> dict[str, Any]:
        """The `count`-th access line, once written (lines are flushed in batches)."""
        deadline = time.monotonic() + timeout
        while len(lines := self.access_lines()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no access line {count}:\n{self.output()[-3000:]}")
            await asyncio.sleep(0.02)
        return lines[count - 1]


async def get(port: int, path: str) -> tuple[int, bytes]:
    response = await request(port, "GET", path)
    try:
        return response.status, await response.body()
    finally:
        response.close()


def chat_body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy (temperature 0, seed 0) streamed chat request for the tiny model."""
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "stream": True,
        **extra,
    }
