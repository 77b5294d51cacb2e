"""Command line for the emulator: `python -m sidecar.emulator [--listen HOST:PORT | --uds PATH]`.

Served by uvicorn with uvloop and httptools, access log off: it must outrun the proxy.
A bad flag value exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

import uvicorn

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) to a (host, port) pair."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m sidecar.emulator",
        description="OpenAI-compatible token streamer standing in for vLLM.",
    )
    parser.add_argument(
        "--listen",
        type=parse_listen,
        default=("127.0.0.1", 8000),
        metavar="HOST:PORT",
        help="TCP address to serve on (default 127.0.0.1:8000)",
    )
    parser.add_argument("--uds", metavar="PATH", help="serve on this Unix socket instead of TCP")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="warning")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    host, port = args.listen
    where = f"unix:{args.uds}" if args.uds else f"http://{host}:{port}"
    print(f"sidestream emulator on {where}", file=sys.stderr, flush=True)
    uvicorn.run(
        "sidecar.emulator:app",
        host=host,
        port=port,
        uds=args.uds,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level=args.log_level,
        backlog=4096,
    )
    return 0
