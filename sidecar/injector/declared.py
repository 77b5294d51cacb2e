"""A labelled pod that already declares a `sidestream` container (written by hand, as in
k8s/base): it is not injected again, but it gets the same drain and grace as an injected
one, and a warning says so, never silence.

Its own settings come from that container's env (`SIDESTREAM_DRAIN_TIMEOUT`,
`SIDESTREAM_ADMIN_LISTEN`), else from the pod's annotations, else the defaults. Anything
the container already has (a preStop) is kept; a grace period is raised, never lowered. An
init container named `sidestream` without `restartPolicy: Always` is no sidecar at all: it
would run to completion before the model starts, so that pod is refused with the reason.
"""

from __future__ import annotations

import re
from typing import Any

from sidecar.injector.drain import sidecar_hook
from sidecar.injector.patch import CONTAINER_NAME, grace_ops, model_hook_ops, status_ops
from sidecar.injector.settings import PREFIX, InvalidAnnotation

JSON = dict[str, Any]
_SECONDS = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def declared_sidecar(pod: JSON) -> tuple[str, int, JSON] | None:
    """("initContainers" or "containers", its index, the container), or None."""
    spec = pod.get("spec") or {}
    for where in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(where) or []):
            if container.get("name") == CONTAINER_NAME:
                return where, index, container
    return None


def declared_patch(pod: JSON, found: tuple[str, int, JSON]) -> tuple[list[JSON], list[str]]:
    """The drain hooks and grace for a pod with its own sidecar, and the warnings."""
    where, index, sidecar = found
    native = where == "initContainers"
    if native and sidecar.get("restartPolicy") != "Always":
        raise InvalidAnnotation(
            [
                f"init container {CONTAINER_NAME!r} has no restartPolicy: Always, so it is not "
                "a sidecar (it would have to exit before the model starts); make it one or "
                f"remove the {PREFIX}inject label"
            ]
        )
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    env = {e.get("name"): e.get("value") for e in sidecar.get("env") or []}
    drain = _number(env.get("SIDESTREAM_DRAIN_TIMEOUT"))
    drain = drain or _number(annotations.get(PREFIX + "drain-timeout")) or 30.0
    admin = str(env.get("SIDESTREAM_ADMIN_LISTEN") or "127.0.0.1:9901")
    port = admin.rpartition(":")[2]
    ops = status_ops(pod, "by-hand")
    warnings = [
        f"container {CONTAINER_NAME!r} is declared in the pod, so it was not injected; it and "
        f"the other containers get the drain hooks and grace period of a drain-timeout of "
        f"{drain:g} s where they lack them"
    ]
    lifecycle = sidecar.get("lifecycle")
    base = f"/spec/{where}/{index}/lifecycle"
    if not port.isdigit():
        warnings.append(
            f"container {CONTAINER_NAME!r} runs no admin listener ({admin}): no drain hook, "
            "its streams end when the model stops"
        )
    elif lifecycle and lifecycle.get("preStop"):
        if lifecycle["preStop"] != sidecar_hook(int(port), native):
            warnings.append(f"container {CONTAINER_NAME!r} keeps its own preStop hook")
    else:
        hook = sidecar_hook(int(port), native)
        if lifecycle:
            ops.append({"op": "add", "path": f"{base}/preStop", "value": hook})
        else:
            ops.append({"op": "add", "path": base, "value": {"preStop": hook}})
    spec = pod.get("spec") or {}
    hook_ops, hook_warnings = model_hook_ops(
        spec, drain, native, int(port) if port.isdigit() else 9901
    )
    return ops + hook_ops + grace_ops(spec, drain), warnings + hook_warnings


def _number(value: object) -> float | None:
    if isinstance(value, str) and _SECONDS.match(value.strip()) and float(value) > 0:
        return float(value)
    return None
