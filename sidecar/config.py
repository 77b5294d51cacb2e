"""The sidecar's settings: command-line flags, each also read from `SIDESTREAM_<NAME>`.

A flag on the command line wins over its environment variable, which wins over the default.
A bad value, from either, exits with status 2 and one line naming the flag (and the variable)
and what it takes (`sidecar.settings_values`); so does a bad `SIDESTREAM_TELEMETRY_SINKS`,
the one variable read elsewhere (`ENV_ONLY`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from sidecar.admin_access import AdminToken, token_file
from sidecar.resume_config import (
    FileSecret,
    header_names,
    password_file,
    resume_problem,
    resume_store,
    secret_file,
)
from sidecar.settings_values import (
    ca_file,
    count_or_off,
    expecting,
    flag_bool,
    health_path,
    host_port,
    host_port_or_off,
    log_level,
    positive_int,
    ready_file,
    seconds,
    seconds_or_off,
    telemetry_sinks,
    usage_mode,
)
from sidecar.upstream.types import Upstream

ENV_PREFIX = "SIDESTREAM_"
# Variables without a flag, read by another part at start: checked here with the flags.
ENV_ONLY: dict[str, Callable[[str], object]] = {
    "SIDESTREAM_TELEMETRY_SINKS": telemetry_sinks,
    "SIDESTREAM_TELEMETRY_ACCESS_ALL": flag_bool,
}
UPSTREAM = "http://HOST:PORT, https://HOST[:PORT], h2c://HOST:PORT or unix:/PATH"


@dataclass(frozen=True)
class Settings:
    listen: tuple[str, int]
    upstream: Upstream
    admin_listen: tuple[str, int] | None
    upstream_health: str
    keepalive_interval: float | None
    first_token_timeout: float | None
    idle_timeout: float | None
    max_duration: float | None
    send_timeout: float | None
    header_timeout: float | None
    drain_timeout: float
    connect_timeout: float
    max_streams: int | None
    max_body: int | None
    max_header_bytes: int
    http2: bool
    certfile: str | None
    keyfile: str | None
    log_level: str
    admin_token_file: AdminToken | None = None
    upstream_ca: str | None = None
    upstream_insecure: bool = False
    ready_file: str | None = None
    usage: str = "force"
    probe: bool = True
    resume: bool = False
    resume_store: str = "memory"
    resume_grace: float = 30.0
    resume_ttl: float = 600.0
    resume_max_bytes: int = 1024 * 1024
    resume_memory: int = 256 * 1024 * 1024
    resume_secret_file: FileSecret | None = None
    resume_credential_headers: tuple[str, ...] = ("authorization", "x-api-key", "cookie")
    resume_store_password_file: FileSecret | None = None
    resume_store_ca: str | None = None
    body_timeout: float | None = 60.0


# (flag, parser, default, help). The default is a string, parsed like any other value.
FLAGS: tuple[tuple[str, Callable[[str], Any], str | None, str], ...] = (
    ("listen", host_port, "0.0.0.0:8080", "traffic listener"),
    (
        "upstream",
        expecting(UPSTREAM, Upstream.parse),
        None,
        "the inference server: http://HOST:PORT, https://HOST:PORT (h2 or HTTP/1.1 by ALPN), "
        "h2c://HOST:PORT or unix:/PATH",
    ),
    (
        "admin-listen",
        host_port_or_off,
        "127.0.0.1:9901",
        "admin listener (/livez /readyz /metrics /drain); 'off' runs none",
    ),
    (
        "admin-token-file",
        expecting("a file holding a token of 16 to 4096 visible ASCII characters", token_file),
        None,
        "a file holding a bearer token that lets callers off loopback use POST /drain and "
        "the live view (read at start); without it they answer loopback only",
    ),
    ("upstream-health", health_path, "/health", "upstream path /readyz checks"),
    ("keepalive-interval", seconds_or_off, "15", "idle seconds before an SSE keep-alive comment"),
    ("first-token-timeout", seconds_or_off, "300", "seconds from request to the first token"),
    ("idle-timeout", seconds_or_off, "120", "seconds allowed between upstream chunks"),
    ("max-duration", seconds_or_off, "3600", "seconds a whole stream may last"),
    ("send-timeout", seconds_or_off, "60", "seconds a client may accept nothing"),
    (
        "header-timeout",
        seconds_or_off,
        "10",
        "seconds a client may take to send a request head; past it 408 (slowloris)",
    ),
    (
        "body-timeout",
        seconds_or_off,
        "60",
        "seconds a client may take to send a whole request body, from the end of its head; "
        "past it 408",
    ),
    ("drain-timeout", seconds, "30", "seconds in-flight streams get on shutdown"),
    ("connect-timeout", seconds, "10", "seconds to connect to the upstream"),
    ("max-streams", count_or_off, "10000", "concurrent requests; past it 503 (0 = no limit)"),
    (
        "max-body",
        count_or_off,
        str(100 * 1024 * 1024),
        "request body bytes; past it 413 (0 = no limit)",
    ),
    ("max-header-bytes", positive_int, "32768", "request header bytes; past it 431"),
    (
        "http2",
        flag_bool,
        "false",
        "serve HTTP/2 (h2c, and h2 with TLS) next to HTTP/1.1 via hypercorn",
    ),
    ("certfile", str, None, "TLS certificate (PEM) for the traffic listener"),
    ("keyfile", str, None, "TLS private key (PEM) for the traffic listener"),
    ("log-level", log_level, "info", "critical, error, warning, info or debug"),
    (
        "upstream-ca",
        ca_file,
        None,
        "CA certificates (PEM) to check an https:// upstream with, instead of the system's",
    ),
    (
        "upstream-insecure",
        flag_bool,
        "false",
        "do not check the https:// upstream's certificate (tests only; warned at start)",
    ),
    (
        "ready-file",
        ready_file,
        None,
        "write the bound addresses here as JSON once every listener is up",
    ),
    (
        "usage",
        usage_mode,
        "force",
        "force: ask OpenAI-style upstreams for usage, hidden from clients that did not ask; "
        "continuous: also per chunk (vLLM); pass: forward requests unchanged",
    ),
    ("probe", flag_bool, "on", "serve GET /sidestream/v1/probe for `sidestream probe` (on/off)"),
    ("resume", flag_bool, "false", "resumable streams: stream ids, Last-Event-ID resume, stop"),
    (
        "resume-store",
        expecting(
            "memory, or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL",
            resume_store,
        ),
        "memory",
        "memory, or redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... (TLS), "
        "redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB] or "
        "redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (any replica)",
    ),
    (
        "resume-grace",
        seconds,
        "30",
        "seconds generation goes on after the last reader left, before the upstream is cancelled",
    ),
    ("resume-ttl", seconds, "600", "seconds a finished stream stays resumable"),
    ("resume-max-bytes", positive_int, str(1024 * 1024), "bytes stored per stream (oldest go)"),
    (
        "resume-memory",
        positive_int,
        str(256 * 1024 * 1024),
        "bytes the memory store holds in all (oldest finished streams go)",
    ),
    (
        "resume-secret-file",
        expecting("a file holding a secret of 16 bytes or more", secret_file),
        None,
        "a file holding the secret (16 bytes or more) that keys the credential hash stored "
        "with each stream; the same on every replica; required with a Redis store",
    ),
    (
        "resume-credential-headers",
        expecting("header names separated by commas", header_names),
        "authorization,x-api-key,cookie",
        "request headers a resume or stop must repeat (this list replaces the default)",
    ),
    (
        "resume-store-password-file",
        expecting("a file holding the Redis password on one line", password_file),
        None,
        "a file holding the Redis store's password (instead of one in the URL)",
    ),
    (
        "resume-store-ca",
        ca_file,
        None,
        "CA certificates (PEM) to check a rediss:// store with, besides the system's",
    ),
)

SWITCHES = ("http2", "upstream-insecure", "resume")  # flags that take no value on the command line


def version() -> str:
    return importlib.metadata.version("sidestream")


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.upper().replace("-", "_")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="sidestream",
        description="sidestream sidecar: a streaming-safe reverse proxy for an inference server.",
        epilog="Timeouts accept 0 or 'off' to disable, but for --drain-timeout and "
        "--connect-timeout, which must end. OTEL_* variables configure telemetry.",
    )
    p.add_argument("--version", action="version", version=f"sidestream {version()}")
    for flag, _, default, text in FLAGS:
        shown = "required" if flag == "upstream" else f"default {default}"
        if flag in SWITCHES:
            p.add_argument(
                f"--{flag}",
                action="store_const",
                const="true",
                help=f"{text} [{env_name(flag)}; {shown}]",
            )
            continue
        metavar = flag.split("-")[-1].upper()
        p.add_argument(f"--{flag}", metavar=metavar, help=f"{text} [{env_name(flag)}; {shown}]")
    return p


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Parse flags and environment into Settings, or exit 2 with one line naming the problem."""
    p = parser()
    args = vars(p.parse_args(argv))
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for flag, parse, default, _ in FLAGS:
        key = flag.replace("-", "_")
        raw, source = args.get(key), f"--{flag}"
        if raw is None and env_name(flag) in environ:
            raw, source = environ[env_name(flag)], f"{env_name(flag)} (--{flag})"
        if raw is None:
            raw = default
        if raw is None:
            if flag == "upstream":
                p.error(f"--upstream (or {env_name(flag)}) is required")
            values[key] = None
            continue
        try:
            values[key] = parse(raw)
        except ValueError as exc:
            p.error(f"argument {source}: {exc}")
    for name, check in ENV_ONLY.items():
        if name in environ:
            try:
                check(environ[name])
            except ValueError as exc:
                p.error(f"{name}: {exc}")
    if (values["certfile"] is None) != (values["keyfile"] is None):
        p.error("argument --certfile/--keyfile: expected both files (PEM) or neither")
    if values["resume"] and (problem := resume_problem(values)) is not None:
        p.error(problem)
    return Settings(**values)


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"sidestream: error: {message}\n")
    raise SystemExit(2)
