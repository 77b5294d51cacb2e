"""Pod annotations -> the injected sidecar's settings (pure, no I/O).

Every setting is a `sidestream.dev/<name>` annotation and maps onto one of the sidecar's
`SIDESTREAM_*` (or `OTEL_*`) environment variables, its resources or a Secret it mounts
(`secrets.py`). Only `upstream-port` is required. Problems are collected, not raised one at
a time, so the warning (or denial) the user sees names every bad annotation at once. Unknown
`sidestream.dev/` keys are a warning, not an error: a typo must not block a rollout, but it
must not pass silently either. docs/kubernetes.md lists every annotation with its default and
range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from middleware.resume.redis_connect import shown
from sidecar.injector.secrets import SECRET_SETTINGS, SecretRef, parse_secret_refs, url_password
from sidecar.injector.sizing import (
    Resources,
    check_streams_fit,
    memory_bytes,
    parse_max_streams,
    parse_resources,
    store_bound,
)
from sidecar.injector.workload import telemetry_env

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
_RESOURCES = ("cpu-request", "cpu-limit", "memory-request", "memory-limit")
KNOWN = frozenset(
    (
        *_DURATIONS,
        *_PORTS,
        *_RESOURCES,
        *SECRET_SETTINGS,
        "mode",
        "image",
        "otel-endpoint",
        "log-level",
        "usage",
        "probe",
        "status",
        "resume",
        "resume-store",
        "resume-memory",
        "max-streams",
        "upstream-health",
    )
)
_SWITCH = {"on": "on", "true": "on", "off": "off", "false": "off"}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")
_PATH = re.compile(r"^/[!-~]{0,255}$")  # visible ASCII: it goes on a request line as is

EnvVar = dict[str, Any]


class InvalidAnnotation(ValueError):
    """One or more `sidestream.dev/*` annotations cannot be used; `problems` names each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class InjectorSettings:
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
    resources: Resources = field(default_factory=Resources)
    max_streams: int | None = None  # None: the sidecar's default
    upstream_health: str | None = None  # None: the sidecar's default, /health
    resume_memory: int | None = None  # bytes; set with the memory store (sizing.store_bound)
    secrets: tuple[SecretRef, ...] = ()

    def env(self, workload: str | None = None) -> list[EnvVar]:
        """The sidecar container's `env`, in a stable order. `workload` names the service in
        telemetry; None takes the pod's app.kubernetes.io/name label through the downward API."""
        env: list[EnvVar] = [
            {"name": "SIDESTREAM_LISTEN", "value": f"0.0.0.0:{self.listen_port}"},
            {"name": "SIDESTREAM_UPSTREAM", "value": f"http://127.0.0.1:{self.upstream_port}"},
            # The kubelet probes the pod IP, so the admin port cannot stay on loopback; there
            # POST /drain and the live view still answer only loopback (the drain hook).
            {"name": "SIDESTREAM_ADMIN_LISTEN", "value": f"0.0.0.0:{self.admin_port}"},
            {"name": "SIDESTREAM_DRAIN_TIMEOUT", "value": _seconds(self.drain_timeout)},
        ]
        for key, value in self.durations:
            env.append({"name": _DURATIONS[key], "value": _seconds(value)})
        optional = (
            ("SIDESTREAM_UPSTREAM_HEALTH", self.upstream_health),
            ("SIDESTREAM_MAX_STREAMS", self.max_streams),
            ("SIDESTREAM_LOG_LEVEL", self.log_level),
            ("SIDESTREAM_USAGE", self.usage),
            ("SIDESTREAM_PROBE", self.probe),
            ("SIDESTREAM_RESUME", "true" if self.resume else None),
            ("SIDESTREAM_RESUME_STORE", self.resume_store),
            ("SIDESTREAM_RESUME_MEMORY", self.resume_memory),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.otel_endpoint),
        )
        env += [{"name": name, "value": str(v)} for name, v in optional if v is not None]
        env += [ref.env() for ref in self.secrets]
        return env + telemetry_env(workload)


def parse_settings(
    annotations: dict[str, str], default_image: str = DEFAULT_IMAGE
) -> tuple[InjectorSettings, list[str]]:
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
    health = ours.get("upstream-health")
    if health is not None and not _PATH.match(health.strip()):
        problems.append(
            f"{PREFIX}upstream-health: {health!r} is not a path: '/' and up to 255 visible "
            "ASCII characters (e.g. /health, /v1/models)"
        )

    resources = parse_resources(ours, PREFIX, problems)
    streams = ours.get("max-streams")
    max_streams = None if streams is None else parse_max_streams(streams, PREFIX, problems)
    secrets = parse_secret_refs(ours, PREFIX, problems)
    resume, store, resume_memory = _resume(ours, resources, max_streams, secrets, problems)
    if streams is None or max_streams is not None:
        check_streams_fit(resources, max_streams, PREFIX, problems)

    if problems or upstream is None:
        raise InvalidAnnotation(problems)
    settings = InjectorSettings(
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
        resume=resume,
        resume_store=store,
        resources=resources,
        max_streams=max_streams,
        upstream_health=health.strip() if health is not None else None,
        resume_memory=resume_memory,
        secrets=tuple(secrets),
    )
    return settings, warnings


def _resume(
    ours: dict[str, str],
    resources: Resources,
    max_streams: int | None,
    secrets: list[SecretRef],
    problems: list[str],
) -> tuple[bool, str | None, int | None]:
    """resume, resume-store and resume-memory, checked together: (resume, store, bound)."""
    flag = ours.get("resume", "false").strip().lower()
    if flag not in _TRUE + _FALSE:
        problems.append(f"{PREFIX}resume: {ours['resume']!r} is not 'true' or 'false'")
    resume = flag in _TRUE
    raw = ours.get("resume-store")
    store = None if raw is None else raw.strip()
    redis = store is not None and store.startswith(("redis://", "rediss://"))
    if store is not None and not (store == "memory" or redis):
        problems.append(f"{PREFIX}resume-store: {shown(store)!r} is not 'memory' or a redis:// URL")
    if redis and store is not None and url_password(store):
        problems.append(
            f"{PREFIX}resume-store: {shown(store)!r} carries a password, which an annotation "
            f"shows to anyone who may read the pod: put it in a Secret and name that Secret in "
            f"{PREFIX}resume-store-password"
        )
    names = {ref.setting for ref in secrets}
    if "resume-store-password" in names and not redis:
        problems.append(f"{PREFIX}resume-store-password needs a redis:// resume-store")
    if resume and redis and "resume-secret" not in names:
        problems.append(
            f"{PREFIX}resume-secret is required with a Redis resume-store: the Secret holding "
            "the key every replica sharing the store hashes credentials with (the sidecar "
            "does not start without it)"
        )
    asked: int | None = None
    if "resume-memory" in ours:
        asked = memory_bytes(ours["resume-memory"].strip())
        if asked is None or asked < 1024 * 1024:
            problems.append(
                f"{PREFIX}resume-memory: {ours['resume-memory']!r} is not memory of 1Mi or "
                "more (bytes with a unit: 64Mi)"
            )
            return resume, store, None
    if not resume or redis or store not in (None, "memory"):
        return resume, store, None
    return resume, store, store_bound(resources, max_streams, asked, PREFIX, problems)


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)
