"""`python -m bench.lab.first_token [--requests N] [SIDECAR FLAGS...]`: where the sidecar's time
to the first token goes, phase by phase, on a new connection (scenario e's request).

The emulator runs on one core, the sidecar in this process on the other (telemetry off unless
the OTEL_* variables say otherwise), and a client thread opens `N` new connections one after
another, each asking for one token. Wrappers on the sidecar's own functions stamp each
request's moments (`time.perf_counter_ns`):

    made      the connection is made            read      its first bytes are in
    head      the request head is parsed        task      the request's task starts (guard)
    app       the proxy app is called           written   the upstream request is written
    answered  the upstream's response begins    parsed    the upstream's head is parsed
    start     the guard gets the response head  scanned   the first-token scan is done
    first     the first body write is done (head and first token on the wire)

and it prints each phase's p50 over the requests, and the sum of the sidecar's own phases
(all but written -> answered, which is the upstream's). Wall time, in-process and warm as the
benchmark's requests are: it shows which step of the path a change moved, not the added TTFT
itself (`python -m bench.ttft` measures that, side by side with nginx). Each wrapper costs
about 0.3 us, and a phase that runs inside another's is not counted twice.
For an A/B, run it from each tree (a `git worktree`) in turn.

    python -m bench.lab.first_token --requests 2000
    python -m bench.lab.first_token --requests 2000 --usage pass   # without forced usage
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from time import perf_counter_ns
from typing import Any

MOMENTS = (
    "made", "read", "head", "task", "app", "written",
    "answered", "parsed", "start", "scanned", "first",
)  # fmt: skip
UPSTREAM = ("written", "answered")  # the phase that is the upstream's, not the sidecar's


class Stamps:
    """The moments of the request in flight (one at a time), and those of every request."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}
        self.requests: list[dict[str, int]] = []
        self.on = False

    def stamp(self, moment: str) -> None:
        self.current.setdefault(moment, perf_counter_ns())

    def wrap(self, owner: Any, name: str, moment: str, after: bool = False) -> None:
        """Stamp `moment` when `owner.name` is called (or has returned, `after`)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def stamped(*args: Any, **kwargs: Any) -> Any:
            if not after:
                self.stamp(moment)
            result = original(*args, **kwargs)
            if after:
                self.stamp(moment)
            return result

        setattr(owner, name, stamped)


def instrument(stamps: Stamps) -> None:
    """The wrappers, on the sidecar's classes (before it starts)."""
    from middleware.cycle import Cycle
    from middleware.guard import StreamGuard
    from middleware.relay import Relay
    from sidecar.proxy import ProxyApp
    from sidecar.servers.http1.cycle import RequestCycle
    from sidecar.servers.http1.protocol import Http1Protocol as Protocol
    from sidecar.upstream.h1 import H1Connection

    made = Protocol.connection_made

    def connection_made(self: Any, transport: Any) -> None:
        stamps.current = {}
        stamps.stamp("made")
        made(self, transport)

    Protocol.connection_made = connection_made  # type: ignore[method-assign]
    stamps.wrap(Protocol, "data_received", "read")
    stamps.wrap(Protocol, "on_headers_complete", "head")
    stamps.wrap(StreamGuard, "handle", "task")
    stamps.wrap(ProxyApp, "__call__", "app")
    stamps.wrap(H1Connection, "write", "written")
    stamps.wrap(H1Connection, "on_message_begin", "answered")
    stamps.wrap(H1Connection, "on_headers_complete", "parsed", after=True)
    stamps.wrap(Cycle, "_start", "start")
    stamps.wrap(Relay, "_scan", "scanned", after=True)
    send = RequestCycle.send

    async def first_write(self: Any, message: Any) -> None:
        await send(self, message)
        if message["type"] == "http.response.body" and "first" not in stamps.current:
            stamps.stamp("first")
            if stamps.on:
                stamps.requests.append(stamps.current)

    RequestCycle.send = first_write  # type: ignore[method-assign]


def client(port: int, requests: int, stamps: Stamps, done: Callable[[], None]) -> None:
    """Scenario e's request on `requests` new connections, one after another (after a
    warm-up), then `done()`."""
    from bench.loadgen import request

    os.sched_setaffinity(0, {1})
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                done()
                return
            time.sleep(0.05)
    payload = request("127.0.0.1", port, {"tokens": 1, "itl_ms": 0, "stamp": "content"})

    def one() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(payload)
            received = b""
            while not received.endswith(b"0\r\n\r\n"):
                data = sock.recv(65536)
                if not data:
                    break
                received += data

    try:
        for _ in range(100):
            one()
        stamps.on = True
        for _ in range(requests):
            one()
            time.sleep(0.002)  # the sidecar idle between requests, as between a user's
    finally:
        stamps.on = False
        done()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab.first_token", description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    args, flags = parser.parse_known_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    if len(os.sched_getaffinity(0)) < 2:
        print("needs two cores: the emulator and the client on one, the sidecar on the other")
        return 2
    from bench.targets import free_port, wait_port
    from sidecar.app import run
    from sidecar.config import load

    os.environ.setdefault("OTEL_SDK_DISABLED", "true")
    upstream, port = free_port(), free_port()
    argv_emulator = ["-m", "sidecar.emulator", "--listen", f"127.0.0.1:{upstream}"]
    emulator = subprocess.Popen(["taskset", "-c", "1", sys.executable, *argv_emulator])
    try:
        wait_port(upstream, emulator)
        os.sched_setaffinity(0, {0})
        settings = load(
            [f"--upstream=http://127.0.0.1:{upstream}", f"--listen=127.0.0.1:{port}"]
            + ["--admin-listen=off", *flags]
        )
        stamps = Stamps()
        instrument(stamps)
        stop = functools.partial(os.kill, os.getpid(), signal.SIGTERM)
        threading.Thread(
            target=client, args=(port, args.requests, stamps, stop), daemon=True
        ).start()
        run(settings)
    finally:
        emulator.terminate()
        emulator.wait(10)
    return report(stamps.requests)


def report(requests: list[dict[str, int]]) -> int:
    whole = [r for r in requests if all(m in r for m in MOMENTS)]
    if not whole:
        print("no request was stamped at every moment")
        return 1
    print(f"{len(whole)} requests, p50 of each phase in us")
    own = 0.0
    for a, b in pairwise(MOMENTS):
        p50 = statistics.median((r[b] - r[a]) / 1e3 for r in whole)
        mark = " (the upstream)" if (a, b) == UPSTREAM else ""
        own += 0 if mark else p50
        print(f"  {a:>8} -> {b:<8} {p50:7.1f}{mark}")
    print(f"  the sidecar's own phases, summed: {own:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
