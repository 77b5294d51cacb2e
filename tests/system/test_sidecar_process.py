"""The sidecar as a process: command line, environment, signals, drain and exit status.

Each test starts `python -m sidecar` as a real child process in front of the emulator,
which runs in the test's own loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.config import FLAGS, env_name, load
from sidecar.emulator import Stats, make_app
from tests.support.procs import CHAT, Child, chat, get
from tests.support.servers import serve
from tests.support.sseparse import parse


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[int, Stats]]:
    stats = Stats()
    async with serve(make_app(stats=stats)) as port:
        yield port, stats


def test_help_names_every_flag_with_its_env_var_and_default() -> None:
    """--help documents each flag with its SIDESTREAM_* variable and its default."""
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "--help"], capture_output=True, text=True, check=True
    )
    text = " ".join(out.stdout.split())
    for flag, _, default, _ in FLAGS:
        assert f"--{flag}" in text
        assert env_name(flag) in text
        if default is not None and flag != "http2":
            assert f"default {default}" in text


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--idle-timeout", "soon"], {}, "--idle-timeout"),
        (["--listen", "8080"], {}, "--listen"),
        (["--upstream", "ftp://x:1"], {}, "--upstream"),
        ([], {"SIDESTREAM_MAX_STREAMS": "-1"}, "SIDESTREAM_MAX_STREAMS (--max-streams)"),
        (["--certfile", "a.pem"], {}, "--certfile/--keyfile"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_flag(
    args: list[str], env: dict[str, str], named: str
) -> None:
    """A bad flag or env value exits with status 2 and a single line that names it."""
    base = [] if any(a == "--upstream" for a in args) else ["--upstream", "http://127.0.0.1:1"]
    environ = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", *base, *args], capture_output=True, text=True, env=environ
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]


def test_flags_win_over_env_which_wins_over_defaults() -> None:
    """Precedence: command line, then SIDESTREAM_* variables, then defaults; 'off' disables a timeout."""
    env = {
        "SIDESTREAM_UPSTREAM": "unix:/run/vllm.sock",
        "SIDESTREAM_IDLE_TIMEOUT": "5",
        "SIDESTREAM_MAX_DURATION": "off",
    }
    settings = load(["--idle-timeout", "7"], environ=env)
    assert settings.upstream.scheme == "unix" and settings.upstream.path == "/run/vllm.sock"
    assert settings.idle_timeout == 7.0
    assert settings.max_duration is None
    assert settings.keepalive_interval == 15.0 and settings.listen == ("0.0.0.0", 8080)
    assert settings.admin_listen == ("127.0.0.1", 9901)


def test_nofile_limit_is_raised_to_the_hard_limit() -> None:
    """At start the soft RLIMIT_NOFILE is raised to the hard limit (each stream holds two sockets)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]));"
        "from sidecar.app import raise_nofile_limit; print(raise_nofile_limit())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == hard


@pytest.mark.parametrize("trigger", ["SIGTERM", "POST /drain"])
async def test_drain_lets_short_streams_finish_and_ends_the_rest_retryably(
    emulator: tuple[int, Stats], trigger: str
) -> None:
    """Drain: readyz 503 at once, new requests 503, short streams finish, long ones end retryably, exit 0."""
    upstream, _ = emulator
    child = Child(upstream, "--drain-timeout", "1.5", "--keepalive-interval", "0.2")
    try:
        await child.ready()
        assert (await get(child.admin, "/readyz"))[0] == 200
        short = [
            asyncio.ensure_future(get(child.port, CHAT, "POST", chat(20, 20))) for _ in range(5)
        ]
        long = [
            asyncio.ensure_future(get(child.port, CHAT, "POST", chat(1000, 20))) for _ in range(5)
        ]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        if trigger == "SIGTERM":
            child.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)
        else:
            assert (await get(child.admin, "/drain", "POST"))[0] == 202
        ready_status, _, _ = await get(child.admin, "/readyz")
        new_status, new_headers, new_body = await get(child.port, CHAT, "POST", chat(5, 0))
        code = await child.exit_code(timeout=1.5 + 1.0 + 0.5)
        exited_after = time.monotonic() - started
        short_results = await asyncio.gather(*short)
        long_results = await asyncio.gather(*long)
    finally:
        child.kill()
    assert ready_status == 503
    assert new_status == 503 and new_headers["retry-after"] == "1"
    assert json.loads(new_body)["error"]["code"] == "shutting_down"
    for status, _, body in short_results:
        assert status == 200 and parse(body)[-1][1] == "[DONE]"
    for status, _, body in long_results:
        last = json.loads(parse(body)[-1][1])
        assert status == 200 and last["error"]["code"] == "shutting_down"
    assert code == 0
    assert exited_after < 1.5 + 1.0


async def test_second_sigterm_stops_at_once(emulator: tuple[int, Stats]) -> None:
    """A second SIGTERM during the drain ends the remaining streams and the process right away."""
    upstream, _ = emulator
    child = Child(upstream, "--drain-timeout", "30")
    try:
        await child.ready()
        streams: list[Any] = [
            asyncio.ensure_future(get(child.port, CHAT, "POST", chat(1000, 20))) for _ in range(3)
        ]
        await asyncio.sleep(0.2)
        child.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert child.process.poll() is None  # still draining
        t0 = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        code = await child.exit_code(timeout=3)
        took = time.monotonic() - t0
        results = await asyncio.gather(*streams)
    finally:
        child.kill()
    assert code == 0 and took < 2.5
    for status, _, body in results:
        assert status == 200 and json.loads(parse(body)[-1][1])["error"]["code"] == "shutting_down"


def _wakeups(pid: int) -> int:
    """Times the process's main thread has gone to sleep and been woken (its event loop)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/PID/status")


async def test_an_idle_sidecar_is_not_woken(emulator: tuple[int, Stats]) -> None:
    """Idle means asleep: after serving a stream, the process's event loop sleeps until the next
    request or signal (uvicorn's own loop polls its exit flag ten times a second per server),
    and a signal still stops it at once."""
    upstream, _ = emulator
    child = Child(upstream)
    try:
        await child.ready()
        status, _, body = await get(child.port, CHAT, "POST", chat(5, 0))
        assert status == 200 and parse(body)[-1][1] == "[DONE]"
        await asyncio.sleep(0.5)  # the connections' close and the loop settle
        before = _wakeups(child.process.pid)
        await asyncio.sleep(2.0)
        woken = _wakeups(child.process.pid) - before
        child.process.send_signal(signal.SIGTERM)
        code = await child.exit_code(timeout=3)
    finally:
        child.kill()
    assert woken <= 4, f"{woken} wake-ups in 2 s of idle (polling makes ~20)"
    assert code == 0
