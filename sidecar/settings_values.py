"""What each sidecar setting takes: one parser per kind of value (`sidecar.config` lists the
flags).

A parser returns the value, or raises ValueError with a message that says what the setting
takes, beginning `expected …`; `sidecar.config.load` puts the flag (and the variable) before it,
so every bad value is one line: `sidestream: error: argument --idle-timeout: expected …`.

Timeouts take `0` or `off` to turn them off (`seconds_or_off`), except the two that must end
(`seconds`): a drain that never ended would hold SIGTERM until the kubelet's SIGKILL cut every
stream without its retryable end; a connect with no bound would hold each request to an
upstream that drops packets for the kernel's own limit (about two minutes). The resume
grace and time to live are durations of a feature that is on, not timeouts: `off` there is
`--resume` off.
"""

from __future__ import annotations

import math
import os
import ssl
import stat
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

OFF = ("0", "off", "none")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


def expecting(what: str, parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse`, its errors led by what the setting takes (for parsers that say only what is
    wrong with the value, as a file's do)."""

    def parse_value(value: str) -> T:
        try:
            return parse(value)
        except ValueError as exc:
            if str(exc).startswith("expected"):
                raise
            raise ValueError(f"expected {what}: {exc}") from None

    return parse_value


def host_port(value: str) -> tuple[str, int]:
    """HOST:PORT; port 0 asks the system for a free port (the start line and the ready file
    name the one bound)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (port 0 to 65535), got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def host_port_or_off(value: str) -> tuple[str, int] | None:
    if value.strip().lower() == "off":
        return None
    try:
        return host_port(value)
    except ValueError:
        raise ValueError(f"expected HOST:PORT (port 0 to 65535) or off, got {value!r}") from None


def ca_file(value: str) -> str:
    """A PEM file of CA certificates, loaded once here so a bad one is a flag error."""
    try:
        ssl.create_default_context(cafile=value)
    except (OSError, ssl.SSLError) as exc:
        message = f"expected a PEM file of CA certificates: cannot load them from {value!r}"
        raise ValueError(f"{message}: {exc}") from None
    return value


def _number(value: str, kind: Callable[[str], float], expected: str) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"expected {expected}, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"expected {expected}, got {value!r}")
    return number


def seconds_or_off(value: str) -> float | None:
    """A timeout: seconds > 0; `0`, `off` or `none` turns it off."""
    if value.strip().lower() in OFF:
        return None
    return _number(value, float, "seconds > 0, or 0 or off to turn the timeout off")


def seconds(value: str) -> float:
    """Seconds > 0, never off (the module docstring says which and why)."""
    return _number(value, float, "seconds > 0 (this one cannot be turned off)")


def count_or_off(value: str) -> int | None:
    """A limit: a whole number > 0; `0`, `off` or `none` means no limit."""
    if value.strip().lower() in OFF:
        return None
    return int(_number(value, int, "a whole number > 0, or 0 or off for no limit"))


def positive_int(value: str) -> int:
    return int(_number(value, int, "a whole number > 0"))


def ready_file(value: str) -> str:
    """A file to write once the listeners are up: its directory must exist now, or the write
    would fail after start, with the sidecar serving and nobody told."""
    directory = os.path.dirname(value) or "."
    if not value or value.endswith("/") or not os.path.isdir(directory):
        raise ValueError(f"expected a file path in an existing directory, got {value!r}")
    return value


def health_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"expected a path starting with '/', got {value!r}")
    return value


def one_of(*choices: str) -> Callable[[str], str]:
    """One of `choices`, case-insensitive; the error lists them."""
    listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"

    def choice(value: str) -> str:
        chosen = value.strip().lower()
        if chosen not in choices:
            raise ValueError(f"expected {listed}; got {value!r}")
        return chosen

    return choice


log_level = one_of("critical", "error", "warning", "info", "debug")
usage_mode = one_of("force", "continuous", "pass")


def flag_bool(value: str) -> bool:
    """on or off, as the docs write it; true/false, yes/no and 1/0 too."""
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise ValueError(f"expected on or off (or true/false, yes/no, 1/0), got {value!r}")


def telemetry_sinks(value: str) -> frozenset[str]:
    """`SIDESTREAM_TELEMETRY_SINKS` (read by `Telemetry.from_env`), checked with the flags so
    that a bad one stops the start with one line, as a bad flag does."""
    from middleware.telemetry.sinks import SINKS, parse_sinks

    try:
        return parse_sinks(value)
    except ValueError:
        known = ", ".join(sorted(SINKS))
        expected = f"sink names from {known}, separated by commas, or none"
        raise ValueError(f"expected {expected}; got {value!r}") from None


def small_file(path: str, limit: int, what: str = "value") -> bytes:
    """The bytes of the file at `path` that holds one secret `what`, at most `limit` of them.
    A regular file only: a FIFO would block the start for good. A ValueError names the file
    and the problem, never the content."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{path!r} is not a regular file")
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ValueError(f"{path!r} holds more than {limit} bytes; expected one {what}")
    return data
