"""Soak: mixed traffic through the sidecar for a bounded time, then check that nothing leaked.

`python -m bench.soak --duration 120 --concurrency 300` (or `make soak`) runs, in one
process and one loop: `tests.support.faulty.FaultyUpstream`, the sidecar exactly as `python -m
sidecar` builds it (under uvicorn on 127.0.0.1), and `concurrency` client workers. Each
request is one of: normal, slow reader (pauses between reads), client abort (FIN or RST
mid-stream, 10%), upstream failure (FIN, RST or a truncated chunk mid-stream, 5%).

After a warm-up at full load it takes a baseline, runs, lets everything settle, and checks:
RSS within a margin of the baseline; file descriptors and asyncio tasks back at the
baseline (idle keep-alive connections to the upstream are legitimate and factored out:
each costs two descriptors and one upstream task in this process); every request has
exactly one outcome and it is the one its kind implies; every client saw a well-formed end;
every stream's access line carries usage (output tokens, reported or counted), whatever its
outcome. Outcomes come from `tests.support.faulty.record_outcomes`.
Exits 1 and lists the problems when a check fails. It stops by itself after `--duration`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware.errors import Outcome
from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry, semconv
from sidecar.app import build_guard
from sidecar.config import load
from tests.support.clients import request
from tests.support.faulty import FaultyUpstream, record_outcomes
from tests.support.servers import serve
from tests.support.sseparse import parse

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
EXPECTED = {
    "normal": Outcome.COMPLETED,
    "slow": Outcome.COMPLETED,
    "abort": Outcome.CLIENT_DISCONNECTED,
    "upstream_failure": Outcome.UPSTREAM_ERROR,
}
REQUEST_TIMEOUT = 30.0


@dataclass
class Report:
    requests: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    # outcome -> [streams, streams whose access line had usage]
    usage: dict[str, list[int]] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "outcomes": dict(self.outcomes),
            "usage_by_outcome": {
                k: {"streams": v[0], "with_usage": v[1]} for k, v in self.usage.items()
            },
            "baseline": self.baseline,
            "after": self.after,
            "problems": self.problems,
        }


class AccessLines(logging.Handler):
    """The access lines logged during the soak, parsed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def pick(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.10:
        return "abort"
    if roll < 0.15:
        return "upstream_failure"
    if roll < 0.25:
        return "slow"
    return "normal"


async def one(port: int, kind: str, rng: random.Random) -> str | None:
    """Run one request of `kind`; a problem description, or None when it ended as it should."""
    tokens = rng.randint(5, 40) if kind != "abort" else 100_000
    headers = [("X-Fault-Tokens", str(tokens)), ("X-Fault-ITL-Ms", str(rng.randint(2, 20)))]
    if kind == "upstream_failure":
        headers.append(("X-Fault", rng.choice(("fin", "rst", "truncated"))))
    response = await request(port, "POST", CHAT, body=BODY, headers=headers)
    try:
        if response.status != 200:
            return f"{kind}: status {response.status}"
        if kind == "abort":
            for _ in range(rng.randint(1, 4)):
                await response.chunk()
            if rng.random() < 0.5:
                sock = response.writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return None
        parts = []
        while (data := await response.chunk()) is not None:
            parts.append(data)
            if kind == "slow":
                await asyncio.sleep(0.03)
        events = parse(b"".join(parts))
        last = events[-1][1] if events else ""
        if kind == "upstream_failure":
            if json.loads(last).get("error", {}).get("type") != "upstream_error":
                return f"{kind}: ended with {last[:80]!r}"
        elif last != "[DONE]":
            return f"{kind}: ended with {last[:80]!r}"
        return None
    finally:
        response.close()


def measure(upstream: FaultyUpstream) -> dict[str, float]:
    gc.collect()
    with open("/proc/self/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return {
        "rss_mb": round(rss_kb / 1024, 1),
        "fds": len(os.listdir("/proc/self/fd")) - 2 * upstream.open,
        "tasks": len(asyncio.all_tasks()) - upstream.open,
        "upstream_idle": upstream.open,
    }


async def settle(
    upstream: FaultyUpstream, registry: StreamRegistry, baseline: dict[str, float] | None
) -> None:
    """Wait until no request is in flight and, given a baseline, the counts are back to it."""
    await registry.wait_empty(10)
    for _ in range(500):
        now = measure(upstream)
        if upstream.busy == 0 and (
            baseline is None
            or (now["fds"] <= baseline["fds"] and now["tasks"] <= baseline["tasks"])
        ):
            return
        await asyncio.sleep(0.01)


async def soak(
    duration: float,
    concurrency: int,
    *,
    warmup: float | None = None,
    rss_margin_mb: float = 32.0,
    seed: int = 0,
) -> Report:
    """Run the soak and return its report (`problems` is empty when every check passed)."""
    report = Report()
    rng = random.Random(seed)
    warmup = min(10.0, duration / 5) if warmup is None else warmup
    lines = AccessLines()
    access = logging.getLogger(semconv.ACCESS_LOGGER)
    access.addHandler(lines)
    access.setLevel(logging.INFO)
    with record_outcomes() as outcomes:
        async with FaultyUpstream() as upstream:
            settings = load(
                ["--upstream", f"http://127.0.0.1:{upstream.port}", "--keepalive-interval", "1"],
                environ={},
            )
            registry = StreamRegistry()
            guard = build_guard(
                settings, registry, Telemetry(metric_readers=[InMemoryMetricReader()])
            )
            async with serve(guard, backlog=4096) as port:

                async def worker(until: float) -> None:
                    while time.monotonic() < until:
                        kind = pick(rng)
                        report.requests[kind] += 1
                        try:
                            async with asyncio.timeout(REQUEST_TIMEOUT):
                                problem = await one(port, kind, rng)
                        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                            problem = f"{kind}: not well-formed: {exc!r}"
                        except TimeoutError:
                            problem = f"{kind}: no end within {REQUEST_TIMEOUT} s"
                        if problem is not None:
                            report.problems.append(problem)

                async def phase(seconds: float) -> None:
                    until = time.monotonic() + seconds
                    await asyncio.gather(*(worker(until) for _ in range(concurrency)))

                await phase(warmup)
                await settle(upstream, registry, None)
                await asyncio.sleep(0.1)
                report.baseline = measure(upstream)
                await phase(duration)
                await settle(upstream, registry, report.baseline)
                report.after = measure(upstream)
    access.removeHandler(lines)
    report.outcomes = Counter(str(o) for o in outcomes)
    for line in lines.lines:
        tally = report.usage.setdefault(line["outcome"], [0, 0])
        tally[0] += 1
        tally[1] += line["output_tokens"] is not None
    check(report, rss_margin_mb)
    return report


def check(report: Report, rss_margin_mb: float) -> None:
    base, after, problems = report.baseline, report.after, report.problems
    if after["rss_mb"] > base["rss_mb"] + rss_margin_mb:
        problems.append(f"RSS grew {after['rss_mb'] - base['rss_mb']:.1f} MB")
    for name in ("fds", "tasks"):
        if after[name] > base[name]:
            problems.append(f"{name}: {after[name]} after, {base[name]} at the baseline")
    total = sum(report.requests.values())
    if sum(report.outcomes.values()) != total:
        problems.append(f"{total} requests but {sum(report.outcomes.values())} outcomes")
    expected: Counter[str] = Counter()
    for kind, count in report.requests.items():
        expected[str(EXPECTED[kind])] += count
    if expected != report.outcomes:
        problems.append(f"outcomes {dict(report.outcomes)}, expected {dict(expected)}")
    for outcome, (streams, with_usage) in report.usage.items():
        if with_usage != streams:
            problems.append(f"{outcome}: {streams - with_usage} of {streams} streams without usage")
    if sum(v[0] for v in report.usage.values()) != total:
        problems.append(
            f"{total} requests but {sum(v[0] for v in report.usage.values())} access lines"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="seconds of load (default 120)"
    )
    parser.add_argument("--concurrency", type=int, default=300, help="client workers (default 300)")
    parser.add_argument("--rss-margin-mb", type=float, default=32.0, help="allowed RSS growth")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = asyncio.run(
        soak(args.duration, args.concurrency, rss_margin_mb=args.rss_margin_mb, seed=args.seed)
    )
    print(json.dumps(report.as_dict(), indent=2))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
