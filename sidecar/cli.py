"""`sidestream` / `python -m sidecar`: parse the settings and run the sidecar."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.config import load
from sidecar.server import run


def main(argv: Sequence[str] | None = None) -> int:
    return run(load(argv))
