"""What this process is: its version and which core runs, for `/metrics` and the ready file.

`sidestream_build_info{version="0.1.0",core="compiled core",python="3.11.7"} 1`, the usual
Prometheus build-info gauge: during a rollout `count by (version) (sidestream_build_info)`
shows how many pods run each release, and a pod that fell back to the pure-Python core
shows in its `core` label.
"""

from __future__ import annotations

import inspect
import platform
from collections.abc import Awaitable, Callable
from typing import Any

from middleware.registry import StreamRegistry
from sidecar.config import version
from sidecar.speedups import running

Metrics = Callable[[], Awaitable[bytes] | bytes]


def build_info() -> dict[str, str]:
    return {"version": version(), "core": running(), "python": platform.python_version()}


def prometheus_text() -> bytes:
    labels = ",".join(f'{name}="{_escaped(value)}"' for name, value in build_info().items())
    return (
        "# HELP sidestream_build_info The sidecar's version and core; always 1.\n"
        "# TYPE sidestream_build_info gauge\n"
        f"sidestream_build_info{{{labels}}} 1\n"
    ).encode()


def with_build_info(metrics: Metrics | None, registry: StreamRegistry) -> Metrics:
    """`/metrics` led by the build info, then `metrics` (or the active streams gauge alone)."""
    info = prometheus_text()  # fixed for the life of the process

    async def combined() -> bytes:
        if metrics is None:
            active = len(registry)
            return (
                info
                + b"# TYPE sidestream_active_streams gauge\n"
                + (b"sidestream_active_streams %d\n" % active)
            )
        produced: Any = metrics()
        text = await produced if inspect.isawaitable(produced) else produced
        return info + bytes(text)

    return combined


def _escaped(value: str) -> str:
    """A Prometheus label value: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
