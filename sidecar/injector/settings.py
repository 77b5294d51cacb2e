"""Pod annotations -> the injected sidecar's settings (pure, no I/O).

Every setting is a `sidestream.dev/<name>` annotation and maps onto one of the sidecar's
`SIDESTREAM_*` (or `OTEL_*`) environment variables. Only `upstream-port` is required.
Problems are collected, not raised one at a time, so the warning (or denial) the user
sees names every bad annotation at once. Unknown `sidestream.dev/` keys are a warning,
not an error: a typo must not block a rollout, but it must not pass silently either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

PREFIX = "sidestream.dev/"
INJECT_LABEL = PREFIX + "inject"
STATUS_ANNOTATION = PREFIX + "status"
DEFAULT_IMAGE = "ghcr.io/sidestream/sidestream:0.1.0"

Mode = Literal["native", "classic"]

_DURATIONS = {
    "keepalive-interval": "SIDESTREAM_KEEPALIVE_INTERVAL",
    "idle-timeout": "SIDESTREAM_IDLE_TIMEOUT",
    "first-token-timeout": "SIDESTREAM_FIRST_TOKEN_TIMEOUT",
    "max-duration": "SIDESTREAM_MAX_DURATION",
    "drain-timeout": "SIDESTREAM_DRAIN_TIMEOUT",
    "resume-grace": "SIDESTREAM_RESUME_GRACE",
    "resume-ttl": "SIDESTREAM_RESUME_TTL",
}
_PORTS = ("upstream-port", "listen-port", "admin-port")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_USAGE = ("force", "continuous", "pass")
KNOWN = frozenset(
    (
        *_DURATIONS,
        *_PORTS,
        "mode",
        "image",
        "otel-endpoint",
        "log-level",
        "usage",
        "probe",
        "status",
        "resume",
        "resume-store",
    )
)
_SWITCH = {"on": "on", "true": "on", "off": "off", "false": "off"}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")


class InvalidAnnotation(ValueError):
    """One or more `sidestream.dev/*` annotations cannot be used; `problems` names each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Settings:
    upstream_port: int
    listen_port: int = 8080
    admin_port: int = 9901
    drain_timeout: float = 30.0
    mode: Mode = "native"
    image: str = DEFAULT_IMAGE
    durations: tuple[tuple[str, float], ...] = ()
    otel_endpoint: str | None = None
    log_level: str | None = None
    usage: str | None = None
    probe: str | None = None  # "on" or "off": SIDESTREAM_PROBE
    resume: bool = False
    resume_store: str | None = None

    def env(self) -> list[dict[str, str]]:
        """The sidecar container's `env`, in a stable order."""
        env = [
            {"name": "SIDESTREAM_LISTEN", "value": f"0.0.0.0:{self.listen_port}"},
            {"name": "SIDESTREAM_UPSTREAM", "value": f"http://127.0.0.1:{self.upstream_port}"},
            # The kubelet probes the pod IP, so the admin port cannot stay on loopback.
            {"name": "SIDESTREAM_ADMIN_LISTEN", "value": f"0.0.0.0:{self.admin_port}"},
            {"name": "SIDESTREAM_DRAIN_TIMEOUT", "value": _seconds(self.drain_timeout)},
        ]
        for key, value in self.durations:
            env.append({"name": _DURATIONS[key], "value": _seconds(value)})
        if self.log_level is not None:
            env.append({"name": "SIDESTREAM_LOG_LEVEL", "value": self.log_level})
        if self.usage is not None:
            env.append({"name": "SIDESTREAM_USAGE", "value": self.usage})
        if self.probe is not None:
            env.append({"name": "SIDESTREAM_PROBE", "value": self.probe})
        if self.resume:
            env.append({"name": "SIDESTREAM_RESUME", "value": "true"})
        if self.resume_store is not None:
            env.append({"name": "SIDESTREAM_RESUME_STORE", "value": self.resume_store})
        if self.otel_endpoint is not None:
            env.append({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": self.otel_endpoint})
            env.append({"name": "OTEL_SERVICE_NAME", "value": "sidestream"})
        return env


def parse_settings(
    annotations: dict[str, str], default_image: str = DEFAULT_IMAGE
) -> tuple[Settings, list[str]]:
    """Return the settings and warnings for these annotations, or raise InvalidAnnotation."""
    ours = {k[len(PREFIX) :]: v for k, v in annotations.items() if k.startswith(PREFIX)}
    problems: list[str] = []
    warnings = [
        f"{PREFIX}{key} is not a sidestream setting and was ignored"
        for key in sorted(ours)
        if key not in KNOWN
    ]

    ports: dict[str, int] = {}
    for key in _PORTS:
        if key not in ours:
            continue
        value = ours[key].strip()
        if value.isdigit() and 1 <= int(value) <= 65535:
            ports[key] = int(value)
        else:
            problems.append(f"{PREFIX}{key}: {ours[key]!r} is not a port number (1-65535)")
    if "upstream-port" not in ours:
        problems.append(f"{PREFIX}upstream-port is required (the model server's port)")
    listen, admin = ports.get("listen-port", 8080), ports.get("admin-port", 9901)
    upstream = ports.get("upstream-port")
    if len({listen, admin, upstream}) < 3 and upstream is not None:
        problems.append(
            f"{PREFIX}upstream-port, listen-port and admin-port must differ "
            f"(got {upstream}, {listen}, {admin}): the containers share one network namespace"
        )

    durations: dict[str, float] = {}
    for key in _DURATIONS:
        if key in ours:
            value = ours[key].strip()
            if _NUMBER.match(value) and float(value) > 0:
                durations[key] = float(value)
            else:
                problems.append(f"{PREFIX}{key}: {ours[key]!r} is not a positive number of seconds")

    mode = ours.get("mode", "native").strip()
    if mode not in ("native", "classic"):
        problems.append(f"{PREFIX}mode: {ours['mode']!r} is not 'native' or 'classic'")
    image = ours.get("image", default_image).strip()
    if not _IMAGE.match(image):
        problems.append(f"{PREFIX}image: {ours['image']!r} is not an image reference")
    otel = ours.get("otel-endpoint")
    if otel is not None and not _is_http_url(otel.strip()):
        problems.append(f"{PREFIX}otel-endpoint: {otel!r} is not an http(s) URL")
    level = ours.get("log-level")
    if level is not None and level.strip().lower() not in _LOG_LEVELS:
        problems.append(f"{PREFIX}log-level: {level!r} is not one of {', '.join(_LOG_LEVELS)}")
    probe = ours.get("probe")
    if probe is not None and probe.strip().lower() not in _SWITCH:
        problems.append(f"{PREFIX}probe: {probe!r} is not 'on' or 'off'")

    usage = ours.get("usage")
    if usage is not None and usage.strip().lower() not in _USAGE:
        problems.append(f"{PREFIX}usage: {usage!r} is not one of {', '.join(_USAGE)}")

    resume = ours.get("resume", "false").strip().lower()
    if resume not in _TRUE + _FALSE:
        problems.append(f"{PREFIX}resume: {ours['resume']!r} is not 'true' or 'false'")
    store = ours.get("resume-store")
    if store is not None and not (
        store.strip() == "memory" or store.strip().startswith(("redis://", "rediss://"))
    ):
        problems.append(f"{PREFIX}resume-store: {store!r} is not 'memory' or a redis:// URL")

    if problems or upstream is None:
        raise InvalidAnnotation(problems)
    settings = Settings(
        upstream_port=upstream,
        listen_port=listen,
        admin_port=admin,
        drain_timeout=durations.pop("drain-timeout", 30.0),
        mode="classic" if mode == "classic" else "native",
        image=image,
        durations=tuple(durations.items()),
        otel_endpoint=otel.strip() if otel is not None else None,
        log_level=level.strip().lower() if level is not None else None,
        usage=usage.strip().lower() if usage is not None else None,
        probe=_SWITCH[probe.strip().lower()] if probe is not None else None,
        resume=resume in _TRUE,
        resume_store=store.strip() if store is not None else None,
    )
    return settings, warnings


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)
