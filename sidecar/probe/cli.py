"""`sidestream probe URL`: read the probe through the path in front and report check by check.

Two streams when `--gap-s` is set: the main one with a bare silence (timing, headers,
bunching, compression, the idle cut without keep-alives), then a short one whose silence the
origin's keep-alives fill. Exit status: 0 healthy, 1 a check failed, 2 a usage or
connection error (including a probe that answers 400, 404 or 429).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from middleware.probe import BOUNDS, BadParameter, Shape
from sidecar.probe.analysis import Check, Status, checks
from sidecar.probe.client import ProbeError, Target, read
from sidecar.probe.report import as_json, table

KEEPALIVE_RUN_EVENTS = 4


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sidestream probe",
        description="Find the hop that buffers, compresses or cuts your stream: read "
        "sidestream's probe stream through everything in front of it and report.",
        epilog="Exit status: 0 healthy, 1 a check failed, 2 usage or connection error.",
    )
    p.add_argument("url", help="the sidecar's URL as clients reach it (the probe path is added)")

    def bounded(name: str, flag: str, text: str) -> None:
        b = BOUNDS[name]
        p.add_argument(
            flag,
            dest=name,
            default=None,
            help=f"{text} ({b.low:g}-{b.high:g}; default {b.default:g})",
        )

    bounded("events", "--events", "events to send")
    bounded("interval_ms", "--interval-ms", "milliseconds between events")
    bounded("pad", "--pad", "padding bytes per event")
    bounded("gap_s", "--gap-s", "seconds of silence in the middle; 0 skips the idle checks")
    p.add_argument("--gap", dest="gap_s", help=argparse.SUPPRESS)
    p.add_argument("--http2", action="store_true", help="h2c on http://, h2 only on https://")
    p.add_argument("--insecure", action="store_true", help="do not check the TLS certificate")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def shapes(args: argparse.Namespace) -> tuple[Shape, Shape | None]:
    """The main run's shape and the keep-alive run's (None without a gap)."""
    query = "&".join(
        f"{name}={getattr(args, name)}"
        for name in ("events", "interval_ms", "pad", "gap_s")
        if getattr(args, name) is not None
    )
    plain = Shape.parse(query)
    if plain.gap_s <= 0:
        return plain, None
    kept = Shape(KEEPALIVE_RUN_EVENTS, plain.interval_ms, 0, plain.gap_s, keepalive=True)
    return plain, kept


async def run(target: Target, plain: Shape, kept: Shape | None) -> tuple[list[Check], str]:
    first = await read(target, plain)
    second = await read(target, kept) if kept is not None else None
    title = (
        f"sidestream probe {target.url} (HTTP/{first.http_version}; {plain.events} events x "
        f"{plain.pad} B every {plain.interval_ms} ms; {plain.gap_s:g} s gap)"
    )
    return checks(first, second), title


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        plain, kept = shapes(args)
        target = Target.from_url(args.url, http2=args.http2, insecure=args.insecure)
    except (BadParameter, ProbeError) as exc:
        p.print_usage(sys.stderr)
        sys.stderr.write(f"sidestream probe: error: {exc}\n")
        return 2
    try:
        results, title = asyncio.run(run(target, plain, kept))
    except ProbeError as exc:
        sys.stderr.write(f"sidestream probe: error: {exc}\n")
        return 2
    print(as_json(target.url, results) if args.json else table(title, results))
    return 1 if any(c.status is Status.FAIL for c in results) else 0
