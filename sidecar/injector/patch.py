"""The JSONPatch that injects the sidecar into one pod (pure: dicts in, dicts out).

Deliberate choices, do not "fix":
- Missing parents (`annotations`, `initContainers`, `volumes`, `lifecycle`) are created
  with their own `add` before anything is appended: `add /spec/volumes/-` fails when the
  pod has no `volumes` list at all.
- The native sidecar is appended after existing init containers: it only has to be up
  before the model container, and init containers before it keep their meaning.
- App containers that already have a `preStop` keep it (we warn instead): replacing a
  user's hook could break their shutdown; chaining is theirs to write.
- `terminationGracePeriodSeconds` is raised, never lowered.
"""

from __future__ import annotations

import math
from typing import Any

from sidecar.injector.settings import STATUS_ANNOTATION, Settings

JSON = dict[str, Any]

CONTAINER_NAME = "sidestream"
PORT_NAME = "sidestream"  # the Service's targetPort: only the sidecar has it
ADMIN_PORT_NAME = "sidestream-adm"
TMP_VOLUME = "sidestream-tmp"
RUN_AS = 10001  # the image's numeric USER, so the kubelet can verify runAsNonRoot

# Shutdown budget, in seconds (the README's five lines):
ENDPOINT_PROPAGATION = 5  # keep serving while Services and load balancers stop routing here
DRAIN_MARGIN = 5  # the sidecar's last terminal events and exit after drain-timeout
MODEL_SHUTDOWN = 10  # the model server's own SIGTERM handling (vLLM --shutdown-timeout)

# Runs in the *app* container (vLLM, TGI and SGLang images ship python3; curl is often
# absent): wait for endpoint propagation, start the sidecar's drain, then hold the app's
# SIGTERM back until the sidecar has exited (drain finished) or the budget is spent.
_DRAIN_SCRIPT = """\
import time, urllib.request as u
admin = "http://127.0.0.1:{admin_port}"
time.sleep({propagation})
try:
    u.urlopen(u.Request(admin + "/drain", method="POST"), timeout=2)
except Exception:
    pass
end = time.monotonic() + {wait}
while time.monotonic() < end:
    try:
        u.urlopen(admin + "/livez", timeout=1)
    except Exception:
        break
    time.sleep(1)
"""


def escape(key: str) -> str:
    """RFC 6901: `~` -> `~0`, `/` -> `~1`."""
    return key.replace("~", "~0").replace("/", "~1")


def required_grace_period(drain_timeout: float) -> int:
    """Seconds the pod needs between deletion and SIGKILL for a clean drain."""
    return ENDPOINT_PROPAGATION + math.ceil(drain_timeout) + DRAIN_MARGIN + MODEL_SHUTDOWN


def already_injected(pod: JSON) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(STATUS_ANNOTATION) == "injected":
        return True
    spec = pod.get("spec") or {}
    names = [c.get("name") for c in (spec.get("containers") or [])]
    names += [c.get("name") for c in (spec.get("initContainers") or [])]
    return CONTAINER_NAME in names


def conflicts(pod: JSON, settings: Settings) -> list[str]:
    """Ports or port names in the pod that the sidecar would collide with."""
    spec = pod.get("spec") or {}
    ours = {settings.listen_port, settings.admin_port}
    problems = []
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for port in container.get("ports") or []:
            if port.get("containerPort") in ours:
                problems.append(
                    f"container {container.get('name')!r} already uses port "
                    f"{port['containerPort']}; set sidestream.dev/listen-port or admin-port"
                )
            if port.get("name") in (PORT_NAME, ADMIN_PORT_NAME):
                problems.append(
                    f"container {container.get('name')!r} already has a port named {port['name']!r}"
                )
    return problems


def drain_hook(settings: Settings) -> JSON:
    """The `preStop` handler for app containers: drain the sidecar, then wait for it."""
    script = _DRAIN_SCRIPT.format(
        admin_port=settings.admin_port,
        propagation=ENDPOINT_PROPAGATION,
        wait=math.ceil(settings.drain_timeout) + DRAIN_MARGIN,
    )
    return {"exec": {"command": ["python3", "-c", script]}}


def sidecar_container(settings: Settings) -> JSON:
    """The sidecar container, native (an init container with restartPolicy Always) or classic."""
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "env": settings.env(),
        "ports": [
            {"name": PORT_NAME, "containerPort": settings.listen_port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": settings.admin_port, "protocol": "TCP"},
        ],
        # Startup and liveness check the sidecar alone: a native sidecar must be started
        # before the model container even starts, and a slow model must never get the
        # sidecar restarted. Readiness (/readyz) includes the model's health.
        "startupProbe": _probe("/livez", period=1, failures=30),
        "livenessProbe": _probe("/livez", period=10, failures=3),
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    if settings.mode == "native":
        container["restartPolicy"] = "Always"
    else:
        # Classic sidecars get SIGTERM together with the app: wait out endpoint
        # propagation first, as the app's drain hook does, then SIGTERM starts the drain.
        container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    return container


def tmp_volume() -> JSON:
    return {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}


def build_patch(pod: JSON, settings: Settings) -> tuple[list[JSON], list[str]]:
    """The JSONPatch operations that inject the sidecar, and warnings for the user."""
    ops: list[JSON] = []
    warnings: list[str] = []
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    if not metadata.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append(
        {
            "op": "add",
            "path": f"/metadata/annotations/{escape(STATUS_ANNOTATION)}",
            "value": "injected",
        }
    )

    if settings.mode == "native":
        if not spec.get("initContainers"):
            ops.append({"op": "add", "path": "/spec/initContainers", "value": []})
        target = "/spec/initContainers/-"
    else:
        target = "/spec/containers/-"
    if not spec.get("volumes"):
        ops.append({"op": "add", "path": "/spec/volumes", "value": []})
    ops.append({"op": "add", "path": "/spec/volumes/-", "value": tmp_volume()})

    for index, container in enumerate(spec.get("containers") or []):
        lifecycle = container.get("lifecycle")
        base = f"/spec/containers/{index}/lifecycle"
        if lifecycle and lifecycle.get("preStop"):
            warnings.append(
                f"container {container.get('name')!r} keeps its own preStop hook; it should "
                f"POST http://127.0.0.1:{settings.admin_port}/drain so streams finish first"
            )
        elif lifecycle:
            ops.append({"op": "add", "path": f"{base}/preStop", "value": drain_hook(settings)})
        else:
            ops.append({"op": "add", "path": base, "value": {"preStop": drain_hook(settings)}})
    # Appended after the hooks so container indexes above stay those of the original pod.
    ops.append({"op": "add", "path": target, "value": sidecar_container(settings)})

    required = required_grace_period(settings.drain_timeout)
    current = spec.get("terminationGracePeriodSeconds")
    if current is None or current < required:
        op = "add" if current is None else "replace"
        ops.append({"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": required})
    return ops, warnings


def _probe(path: str, *, period: int, failures: int) -> JSON:
    return {
        "httpGet": {"path": path, "port": ADMIN_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 1 if period == 1 else 2,
        "failureThreshold": failures,
    }
