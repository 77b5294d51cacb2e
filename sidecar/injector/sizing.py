"""The sidecar's CPU and memory, and what fits in its memory limit (pure, no I/O).

The rule, in memory: the limit holds the process itself (`BASE_MEMORY`), every stream
`--max-streams` allows (`STREAM_MEMORY` each), and with the memory resume store that store's
bound, which counts event bytes only, so it gets `STORE_SHARE` of what is left (the rest is
Python's own cost per stored event: a bytes object and a deque slot, about 41 bytes on events
of a few hundred). The figures come from the benchmark's scenario c (RSS growth per idle
stream, on the compiled and the pure-Python core alike) and from the idle process's RSS with
the OpenTelemetry exporters loaded; docs/kubernetes.md's sizing table names the run.

A memory store bound the operator did not set is lowered to what fits; one they set that does
not fit, or a limit that cannot hold the streams, is refused with the numbers that would fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

KiB, MiB, GiB = 1024, 1024**2, 1024**3

BASE_MEMORY = 64 * MiB  # the process with no stream: ~42 MB, ~51 MB with OTLP export
STREAM_MEMORY = 16 * KiB  # per stream --max-streams allows: ~11.5 KB measured per open stream
STORE_SHARE = 0.75  # of the memory left, for the memory store's counted bytes
MIN_STORE = 8 * MiB  # eight of the default 1 MiB per-stream logs
DEFAULT_MAX_STREAMS = 10_000  # the sidecar's own --max-streams default
MAX_STREAMS = 100_000  # the annotation's range is 1 to this

DEFAULT_CPU_REQUEST = "100m"
DEFAULT_MEMORY_REQUEST = "128Mi"
DEFAULT_MEMORY_LIMIT = "256Mi"
CPU_RANGE = (0.01, 64.0)  # cores: 10m to 64
MEMORY_REQUEST_RANGE = (32 * MiB, 64 * GiB)
MEMORY_LIMIT_RANGE = (BASE_MEMORY, 64 * GiB)

# Plain forms only: millicores or decimal cores; whole bytes with a unit. Kubernetes reads
# more (exponents, millibytes), none of which anyone means for a sidecar.
_CPU = re.compile(r"^([0-9]{1,6})m$|^([0-9]{1,3}(\.[0-9]{1,3})?)$")
_MEMORY = re.compile(r"^([0-9]{1,12})(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS |= {"Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": 1024**4}


def cpu_cores(value: str) -> float | None:
    """`100m` or `0.5` as cores; None if it is not one of those forms."""
    match = _CPU.match(value)
    if match is None:
        return None
    return int(match[1]) / 1000 if match[1] is not None else float(match[2])


def memory_bytes(value: str) -> int | None:
    """`256Mi`, `1G` or `1048576` as bytes; None if it is not one of those forms."""
    match = _MEMORY.match(value)
    return None if match is None else int(match[1]) * _UNITS[match[2]]


def mib(size: float) -> str:
    return f"{size / MiB:.0f}Mi" if size >= 10 * MiB else f"{size / MiB:.1f}Mi"


def mib_up(size: float) -> str:
    """A size to raise a limit to: whole MiB, rounded up."""
    return f"{math.ceil(size / MiB)}Mi"


@dataclass(frozen=True)
class Resources:
    cpu_request: str = DEFAULT_CPU_REQUEST
    cpu_limit: str | None = None  # none by default: a throttled sidecar stalls every stream
    memory_request: str = DEFAULT_MEMORY_REQUEST
    memory_limit: str = DEFAULT_MEMORY_LIMIT

    def spec(self) -> dict[str, Any]:
        limits = {"memory": self.memory_limit}
        if self.cpu_limit is not None:
            limits = {"cpu": self.cpu_limit, **limits}
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": limits,
        }


def parse_resources(ours: dict[str, str], prefix: str, problems: list[str]) -> Resources:
    """`cpu-request`, `cpu-limit`, `memory-request`, `memory-limit`: each in its range, each
    limit at least its request. A missing memory request is the default or the limit,
    whichever is smaller."""
    cpu: dict[str, tuple[str, float]] = {}
    for key in ("cpu-request", "cpu-limit"):
        if key in ours:
            value = ours[key].strip()
            cores = cpu_cores(value)
            low, high = CPU_RANGE
            if cores is None or not low <= cores <= high:
                problems.append(
                    f"{prefix}{key}: {ours[key]!r} is not CPU from 10m to 64 "
                    "(millicores like 250m, or cores like 0.5)"
                )
            else:
                cpu[key] = (value, cores)
    memory: dict[str, tuple[str, int]] = {}
    for key, (low, high) in (
        ("memory-request", MEMORY_REQUEST_RANGE),
        ("memory-limit", MEMORY_LIMIT_RANGE),
    ):
        if key in ours:
            value = ours[key].strip()
            size = memory_bytes(value)
            if size is None or not low <= size <= high:
                problems.append(
                    f"{prefix}{key}: {ours[key]!r} is not memory from {mib(low)} to 64Gi "
                    "(bytes with a unit: 512Mi, 1Gi)"
                )
            else:
                memory[key] = (value, size)
    limit = cpu.get("cpu-limit")
    default_cpu = (DEFAULT_CPU_REQUEST, 0.1)
    if limit is not None and limit[1] < default_cpu[1]:
        default_cpu = limit
    request = cpu.get("cpu-request", default_cpu)
    if limit is not None and limit[1] < request[1]:
        problems.append(
            f"{prefix}cpu-limit {limit[0]} is below the CPU request {request[0]}: "
            f"Kubernetes refuses such a container"
        )
    mem_limit = memory.get("memory-limit", (DEFAULT_MEMORY_LIMIT, 256 * MiB))
    default_request = (DEFAULT_MEMORY_REQUEST, 128 * MiB)
    if default_request[1] > mem_limit[1]:
        default_request = mem_limit
    mem_request = memory.get("memory-request", default_request)
    if mem_request[1] > mem_limit[1]:
        problems.append(
            f"{prefix}memory-request {mem_request[0]} is above the memory limit "
            f"{mem_limit[0]}: Kubernetes refuses such a container"
        )
    return Resources(
        cpu_request=request[0],
        cpu_limit=None if limit is None else limit[0],
        memory_request=mem_request[0],
        memory_limit=mem_limit[0],
    )


def parse_max_streams(value: str, prefix: str, problems: list[str]) -> int | None:
    text = value.strip()
    if text.isdigit() and 1 <= int(text) <= MAX_STREAMS:
        return int(text)
    problems.append(
        f"{prefix}max-streams: {value!r} is not a whole number from 1 to {MAX_STREAMS} "
        "(the memory limit is sized from it, so 'no limit' is not offered)"
    )
    return None


def streams_memory(max_streams: int | None) -> int:
    """What the process and its streams take under the limit, store aside."""
    streams = DEFAULT_MAX_STREAMS if max_streams is None else max_streams
    return BASE_MEMORY + streams * STREAM_MEMORY


def store_bound(
    resources: Resources,
    max_streams: int | None,
    asked: int | None,
    prefix: str,
    problems: list[str],
) -> int | None:
    """The memory store's bound in bytes (`asked`, or what fits when None), or None with a
    problem naming what would fit."""
    limit = memory_bytes(resources.memory_limit) or 0
    streams = DEFAULT_MAX_STREAMS if max_streams is None else max_streams
    fits = int((limit - streams_memory(max_streams)) * STORE_SHARE)
    if asked is not None and asked > fits:
        need = streams_memory(max_streams) + asked / STORE_SHARE
        problems.append(
            f"{prefix}resume-memory {mib(asked)} does not fit: memory-limit "
            f"{resources.memory_limit} holds {mib(BASE_MEMORY)} for the process and "
            f"{STREAM_MEMORY // KiB} KiB for each of {streams} streams, and the memory store "
            f"may use {STORE_SHARE:.0%} of the rest ({mib(max(fits, 0))}); raise memory-limit "
            f"to {mib_up(need)} or lower resume-memory or max-streams"
        )
        return None
    if asked is None and fits < MIN_STORE:
        need = streams_memory(max_streams) + MIN_STORE / STORE_SHARE
        problems.append(
            f"{prefix}resume with the memory store: memory-limit {resources.memory_limit} "
            f"leaves {mib(max(fits, 0))} for it after {mib(BASE_MEMORY)} for the process and "
            f"{STREAM_MEMORY // KiB} KiB for each of {streams} streams, under the "
            f"{mib(MIN_STORE)} minimum; raise memory-limit to {mib_up(need)} or lower max-streams"
        )
        return None
    return asked if asked is not None else fits


def check_streams_fit(
    resources: Resources, max_streams: int | None, prefix: str, problems: list[str]
) -> None:
    """The memory limit holds the process and every stream `max-streams` allows."""
    limit = memory_bytes(resources.memory_limit) or 0
    need = streams_memory(max_streams)
    if limit < need:
        streams = DEFAULT_MAX_STREAMS if max_streams is None else max_streams
        most = (limit - BASE_MEMORY) // STREAM_MEMORY
        fewer = f" or set max-streams to {most} or fewer" if most >= 1 else ""
        problems.append(
            f"{prefix}memory-limit {resources.memory_limit} cannot hold {streams} streams "
            f"({mib(BASE_MEMORY)} for the process and {STREAM_MEMORY // KiB} KiB each need "
            f"{mib_up(need)}): raise memory-limit{fewer}"
        )
