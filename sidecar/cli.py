"""`sidestream` / `python -m sidecar`: parse the settings and run the sidecar."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar.app import run
from sidecar.config import Settings, load, version
from sidecar.speedups import running

if TYPE_CHECKING:
    from middleware.telemetry import Telemetry


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["probe"]:  # `sidestream probe URL`: the client, not the sidecar
        from sidecar.probe.cli import main as probe

        return probe(args[1:])
    if "--version" in args:  # and which core: the first thing to ask of an installed wheel
        print(f"sidestream {version()} ({running()})")
        return 0
    settings = load(args)
    telemetry = sidecar_telemetry(settings)
    try:
        return run(settings, telemetry)
    finally:
        if telemetry is not None:
            telemetry.shutdown()  # flush the last spans and metrics


def sidecar_telemetry(settings: Settings) -> Telemetry | None:
    """Telemetry from the OTEL_* variables (None when OTEL_SDK_DISABLED=true).

    Spans are CLIENT spans (the sidecar is the model's client) whose `server.*` name the
    upstream; the access log goes to stdout, one JSON object per line.
    """
    from middleware.telemetry import SpanKind, Telemetry, configure_access_log

    upstream = settings.upstream
    if upstream.scheme == "unix":
        address, port = upstream.path, None
    else:
        address, port = upstream.host, upstream.port
    telemetry = Telemetry.from_env(SpanKind.CLIENT, server_address=address, server_port=port)
    if telemetry is not None:
        configure_access_log()
    return telemetry
