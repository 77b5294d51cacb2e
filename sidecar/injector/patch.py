"""The JSONPatch that injects the sidecar into one pod (pure: dicts in, dicts out).

Deliberate choices, do not "fix":
- Missing parents (`annotations`, `initContainers`, `volumes`, `lifecycle`) are created
  with their own `add` before anything is appended: `add /spec/volumes/-` fails when the
  pod has no `volumes` list at all.
- The native sidecar is appended after existing init containers: it only has to be up
  before the model container, and init containers before it keep their meaning.
- App containers that already have a `preStop` keep it (we warn instead): replacing a
  user's hook could break their shutdown; holding the container while the sidecar drains
  is then theirs to write.
- `terminationGracePeriodSeconds` is raised, never lowered.
"""

from __future__ import annotations

from typing import Any

from sidecar.injector.drain import model_hold, model_hook, required_grace_period, sidecar_hook
from sidecar.injector.settings import STATUS_ANNOTATION, InjectorSettings

JSON = dict[str, Any]

CONTAINER_NAME = "sidestream"
PORT_NAME = "sidestream"  # the Service's targetPort: only the sidecar has it
ADMIN_PORT_NAME = "sidestream-adm"
TMP_VOLUME = "sidestream-tmp"
RUN_AS = 10001  # the image's numeric USER, so the kubelet can verify runAsNonRoot
DONE = ("injected", "by-hand")  # status annotation values: this pod was handled already


def escape(key: str) -> str:
    """RFC 6901: `~` -> `~0`, `/` -> `~1`."""
    return key.replace("~", "~0").replace("/", "~1")


def already_injected(pod: JSON) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(STATUS_ANNOTATION) in DONE


def conflicts(pod: JSON, settings: InjectorSettings) -> list[str]:
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


def sidecar_container(settings: InjectorSettings, workload: str | None = None) -> JSON:
    """The sidecar container, native (an init container with restartPolicy Always) or classic.
    `workload` is the service name telemetry reports (see `workload.workload_name`)."""
    native = settings.mode == "native"
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "env": settings.env(workload),
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
        "resources": settings.resources.spec(),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
            *(ref.mount() for ref in settings.secrets),
        ],
        "lifecycle": {"preStop": sidecar_hook(settings.admin_port, native)},
    }
    if native:
        container["restartPolicy"] = "Always"
    return container


def tmp_volume() -> JSON:
    return {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}


def build_patch(
    pod: JSON, settings: InjectorSettings, workload: str | None = None
) -> tuple[list[JSON], list[str]]:
    """The JSONPatch operations that inject the sidecar, and warnings for the user."""
    ops = status_ops(pod, "injected")
    spec = pod.get("spec") or {}
    if settings.mode == "native":
        if not spec.get("initContainers"):
            ops.append({"op": "add", "path": "/spec/initContainers", "value": []})
        target = "/spec/initContainers/-"
    else:
        target = "/spec/containers/-"
    if not spec.get("volumes"):
        ops.append({"op": "add", "path": "/spec/volumes", "value": []})
    for volume in [tmp_volume(), *(ref.volume() for ref in settings.secrets)]:
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume})
    hook_ops, warnings = model_hook_ops(
        spec, settings.drain_timeout, settings.mode == "native", settings.admin_port
    )
    ops += hook_ops
    # Appended after the hooks so container indexes above stay those of the original pod.
    ops.append({"op": "add", "path": target, "value": sidecar_container(settings, workload)})
    ops += grace_ops(spec, settings.drain_timeout)
    return ops, warnings


def status_ops(pod: JSON, status: str) -> list[JSON]:
    ops: list[JSON] = []
    if not (pod.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    path = f"/metadata/annotations/{escape(STATUS_ANNOTATION)}"
    ops.append({"op": "add", "path": path, "value": status})
    return ops


def model_hook_ops(
    spec: JSON, drain_timeout: float, native: bool, admin_port: int
) -> tuple[list[JSON], list[str]]:
    """A preStop that holds each app container (but ours) while the sidecar drains."""
    ops: list[JSON] = []
    warnings: list[str] = []
    for index, container in enumerate(spec.get("containers") or []):
        if container.get("name") == CONTAINER_NAME:
            continue
        lifecycle = container.get("lifecycle")
        base = f"/spec/containers/{index}/lifecycle"
        hook = model_hook(drain_timeout, native)
        if lifecycle and lifecycle.get("preStop"):
            if lifecycle["preStop"] == hook:
                continue
            warnings.append(
                f"container {container.get('name')!r} keeps its own preStop hook; it should "
                f"keep the container serving for {model_hold(drain_timeout)} s, until the "
                f"sidecar has drained (POST http://127.0.0.1:{admin_port}/drain starts it)"
            )
        elif lifecycle:
            ops.append({"op": "add", "path": f"{base}/preStop", "value": hook})
        else:
            ops.append({"op": "add", "path": base, "value": {"preStop": hook}})
    return ops, warnings


def grace_ops(spec: JSON, drain_timeout: float) -> list[JSON]:
    required = required_grace_period(drain_timeout)
    current = spec.get("terminationGracePeriodSeconds")
    if current is not None and current >= required:
        return []
    op = "add" if current is None else "replace"
    return [{"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": required}]


def _probe(path: str, *, period: int, failures: int) -> JSON:
    return {
        "httpGet": {"path": path, "port": ADMIN_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 1 if period == 1 else 2,
        "failureThreshold": failures,
    }
